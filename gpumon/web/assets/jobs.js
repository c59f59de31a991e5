"use strict";
// The jobs table, from GET /v1/jobs?detail=true: every job with its detail (the document GET /v1/jobs/{job}
// serves), and each job's details below its row once the reader opens them.
const gpumonJobs = (() => {
  const { DASH, isNum, el, small, badge, pct, times, clock, words, duration, si } = gpumonKit;
  const WORSE = 0.9; // the alert rules' thresholds against a baseline (alerts/alerting.rules.yml)
  const SLOWER = 1.1;
  const VERDICT_CLASS = new Map([
    ["compute", "ok"],
    ["idle", ""],
    ["undetermined", ""],
    ["gpu_down", "bad"],
    ["stalled", "bad"],
    ["exited", "bad"],
  ]);
  const openEvidence = new Set(); // jobs whose evidence the reader opened: kept open across redraws
  const openJobs = new Set(); // jobs whose details the reader opened (by their name): likewise

  // jobs: [{summary, detail}], detail null where it could not be read this time
  function rows(jobs) {
    // a job that ended takes its open state with it: a later job of the same name starts closed
    const names = new Set(jobs.map((job) => String(job.summary.job)));
    for (const open of [openJobs, openEvidence]) {
      for (const name of open) if (!names.has(name)) open.delete(name);
    }
    const out = jobs.flatMap((job) => {
      const name = String(job.summary.job);
      return openJobs.has(name) ? [row(job), detailRow(name, job.detail)] : [row(job)];
    });
    if (!out.length) {
      const none = "No job reports to this node. Jobs appear once their ranks report through the gpumon SDK.";
      out.push(el("tr", null, el("td", { colSpan: 6, class: "muted" }, none)));
    }
    return out;
  }

  // GPU uuid -> ["job rank N", ...]: who reports from each GPU
  function users(jobs) {
    const out = new Map();
    for (const { summary, detail } of jobs) {
      for (const rank of detail && Array.isArray(detail.ranks) ? detail.ranks : []) {
        for (const g of Array.isArray(rank.gpus) ? rank.gpus : []) {
          if (!out.has(g.uuid)) out.set(g.uuid, []);
          out.get(g.uuid).push(String(summary.job) + " rank " + rank.rank);
        }
      }
    }
    return out;
  }

  function row({ summary, detail }) {
    const name = String(summary.job);
    const ranks = detail && Array.isArray(detail.ranks) ? detail.ranks : [];
    const kinds = [...new Set(ranks.map((r) => r.kind))].join(", ");
    const world = [...new Set(ranks.map((r) => r.world_size))].join("/");
    const gpus = [...new Set(ranks.flatMap((r) => (r.gpus || []).map((g) => g.index)))].sort((a, b) => a - b);
    const current = detail && detail.baseline && detail.baseline.current;
    const perGpu =
      current && isNum(current.tokens_per_second_per_gpu) ? current.tokens_per_second_per_gpu : null;
    const here = summary.ranks_on_node + (world ? " of " + world : "") + " ranks here";
    return el(
      "tr",
      null,
      el(
        "td",
        null,
        nameButton(name, detail),
        small(here + (kinds ? " \u00b7 " + kinds : "")),
        gpus.length ? small("GPU " + gpus.join(", ")) : null,
      ),
      el(
        "td",
        { class: "num" },
        el("span", { class: "big" }, si(summary.tokens_per_second)),
        perGpu === null ? null : small(si(perGpu) + " per GPU"),
      ),
      el("td", { class: "num" }, el("span", { class: "big" }, pct(summary.mfu, 1))),
      el("td", { class: "num" }, stepTime(detail, ranks)),
      verdict(name, summary, detail),
      baseline(detail),
    );
  }

  // the name opens the job's details below its row, at once, and keeps them open across redraws
  function nameButton(name, detail) {
    const expanded = String(openJobs.has(name));
    const title = "this job's ranks and advice";
    const button = el("button", { class: "job-name", type: "button", ariaExpanded: expanded, title }, name);
    button.addEventListener("click", () => {
      const row = button.closest("tr");
      const next = row.nextElementSibling;
      if (openJobs.delete(name)) {
        if (next && next.classList.contains("job-detail")) next.remove();
      } else {
        openJobs.add(name);
        row.after(detailRow(name, detail));
      }
      button.ariaExpanded = String(openJobs.has(name));
    });
    return button;
  }

  // much what `gpumon diagnose` prints, from the detail the page already has: the advice and each rank here
  function detailRow(name, detail) {
    // location.origin: never the user:password a page may have been opened with
    const href = location.origin + "/v1/jobs/" + encodeURIComponent(name);
    const diagnosis = (detail && detail.diagnosis) || {};
    const ranks = detail && Array.isArray(detail.ranks) ? detail.ranks : [];
    return el(
      "tr",
      { class: "job-detail" },
      el(
        "td",
        { colSpan: 6 },
        detail ? null : small("details unavailable this refresh"),
        diagnosis.advice ? el("p", null, el("b", null, "Advice: "), String(diagnosis.advice)) : null,
        ranks.length ? el("ul", { class: "plain ranks" }, ranks.map(rankLine)) : null,
        el("a", { class: "job-json", href }, "this job as JSON"),
      ),
    );
  }

  function rankLine(r) {
    const rates = r.rates || {};
    const phases = rates.phase_ratios || {};
    const gpus = (Array.isArray(r.gpus) ? r.gpus : []).map((g) => "GPU " + g.index + " " + g.name);
    const mfu = isNum(r.mfu) ? "" : " (" + (r.peak_problem || "no FLOPs per token reported") + ")";
    const figures = [
      si(rates.tokens_per_second) + " tokens/s",
      "step " + duration(rates.step_time_seconds),
      "MFU " + pct(r.mfu, 1) + mfu,
      "data wait " + pct(phases.data_wait),
      "communication " + pct(phases.communication),
      "last report " + clock(r.last_report),
    ];
    const v = r.diagnosis || {};
    const memory = r.memory && r.memory.gap ? small("memory: " + r.memory.gap) : null;
    return el(
      "li",
      null,
      el("b", null, "rank " + r.rank),
      " " + [r.kind, "pid " + r.pid, gpus.join(", ") || "no GPU known"].join(" \u00b7 ") + " ",
      r.gone ? badge(String(r.gone), r.gone === "finished" ? "" : "bad") : null,
      v.bottleneck ? badge(words(v.bottleneck), VERDICT_CLASS.get(v.bottleneck) ?? "warn", v.summary) : null,
      small(figures.join(" \u00b7 ")),
      memory,
    );
  }

  // the daemon's job figure where it has one (the ranks' mean), else the ranks' own
  function stepTime(detail, ranks) {
    const current = detail && detail.baseline && detail.baseline.current;
    if (current && isNum(current.step_time_seconds)) return duration(current.step_time_seconds);
    const steps = ranks.map((r) => r.rates && r.rates.step_time_seconds).filter(isNum);
    if (!steps.length) return DASH;
    const lo = Math.min(...steps);
    const hi = Math.max(...steps);
    return lo === hi ? duration(lo) : duration(lo) + " \u2013 " + duration(hi);
  }

  function verdict(name, summary, detail) {
    const d = (detail && detail.diagnosis) || { bottleneck: summary.bottleneck, summary: summary.summary };
    const cls = VERDICT_CLASS.get(d.bottleneck) ?? "warn";
    const cell = [el("div", null, badge(words(d.bottleneck), cls, d.advice), " ", String(d.summary || ""))];
    for (const f of Array.isArray(d.findings) ? d.findings : [])
      cell.push(badge((f === "finished" || f === "gpu_shared" ? "" : "also: ") + words(f), "warn"));
    for (const n of Array.isArray(d.notes) ? d.notes : []) cell.push(small(String(n)));
    const evidence = Array.isArray(d.evidence) ? d.evidence : [];
    const met = evidence.filter((e) => e.met);
    if (met.length) cell.push(el("ul", { class: "plain small evidence" }, met.map(evidenceLine)));
    if (evidence.length) {
      const all = el(
        "details",
        { open: openEvidence.has(name) },
        el("summary", null, "all " + evidence.length + " signals"),
        el("ul", { class: "plain small evidence" }, evidence.map(evidenceLine)),
      );
      all.addEventListener("toggle", () => (all.open ? openEvidence.add(name) : openEvidence.delete(name)));
      cell.push(all);
    }
    if (detail && detail.goodput && detail.goodput.summary) cell.push(small(detail.goodput.summary));
    if (!detail) cell.push(small("details unavailable this refresh"));
    return el("td", null, cell);
  }

  function evidenceLine(e) {
    const op = e.op === ">=" ? "\u2265" : String(e.op);
    // 40 %, 97.8 %: one decimal at most
    const fmt = (v) =>
      !isNum(v)
        ? DASH
        : e.unit === "ratio"
          ? Number((v * 100).toFixed(1)) + " %"
          : String(Number(v.toFixed(2)));
    const value = e.met === null || e.met === undefined ? "not measured" : fmt(e.value);
    const text = words(e.signal) + " " + value + " (" + op + " " + fmt(e.threshold) + ")";
    return el("li", { class: e.met ? "met" : "unmet" }, text);
  }

  function baseline(detail) {
    const b = detail && detail.baseline;
    if (!b) return el("td", { class: "muted" }, DASH);
    if (!b.key) return el("td", null, small("not comparable: " + (b.why_no_key || "no key")));
    if (!b.baseline || !b.ratios) {
      const k = b.key;
      const key = [k.workload, k.gpu_model, k.gpus + " GPUs", k.dtype, k.flops_convention].join(", ");
      return el("td", null, small(el("span", { title: key }, "no baseline recorded")));
    }
    const r = b.ratios;
    const line = (label, ratio, worse) =>
      el("li", { class: isNum(ratio) && worse(ratio) ? "worse" : "" }, label + " " + times(ratio));
    return el(
      "td",
      { class: "num" },
      el("ul", { class: "plain" }, [
        line("tokens/s", r.tokens_per_second_per_gpu, (x) => x < WORSE),
        line("step", r.step_time_seconds, (x) => x > SLOWER),
        line("MFU", r.mfu, (x) => x < WORSE),
      ]),
      small(el("span", { title: b.baseline.note || "" }, "vs " + b.baseline.name)),
    );
  }

  return { rows, users };
})();
