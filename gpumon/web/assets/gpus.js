"use strict";
// The GPU table and the node's facts, from GET /v1/gpus.
const gpumonGpus = (() => {
  const {
    DASH,
    isNum,
    el,
    small,
    badge,
    bar,
    pct,
    gib,
    watts,
    celsius,
    mhz,
    clock,
    ratioOf,
    words,
    duration,
  } = gpumonKit;
  // [bit, name, serious]: gpumon's table of NVML clock-event reasons, written into the page by the server
  const THROTTLE = JSON.parse(document.body.dataset.throttle || "[]");

  function facts(doc) {
    const parts = [];
    const d = doc.driver || {};
    parts.push("driver " + (d.driver_version || DASH) + ", CUDA " + (d.cuda_driver_version || DASH));
    parts.push(doc.device_count + " GPU(s), sampled every " + duration(doc.interval_seconds));
    const h = doc.host;
    if (h) {
      parts.push("host CPU " + pct(h.cpu_utilization_ratio) + " of " + h.cpu_count + " cores");
      // what `gpumon snapshot` says: available (not used, as HBM is) of total, labelled so
      const available = gib(h.memory_available_bytes);
      parts.push("memory " + available + " / " + gib(h.memory_total_bytes) + " GiB available");
      if (isNum(h.load1))
        parts.push("load " + [h.load1, h.load5, h.load15].map((l) => l.toFixed(2)).join(" "));
    }
    const out = [parts.join(" \u00b7 ")];
    if (doc.events && !doc.events.running) {
      out.push(" ", badge("XID watcher off", "warn", String(doc.events.reason || "")));
    }
    const errors = Array.isArray(doc.errors) ? doc.errors : [];
    const count = errors.reduce((n, e) => n + (isNum(e.count) ? e.count : 0), 0);
    if (count) {
      const lines = errors.map((e) => "GPU " + e.gpu + " " + e.op + ": " + e.error + " \u00d7" + e.count);
      out.push(" ", badge(count + " NVML error(s)", "warn", lines.join("\n")));
    }
    return out;
  }

  // users: GPU uuid -> ["job rank N", ...], from the jobs' details
  function rows(doc, users) {
    const out = doc.gpus.map((g) => row(g, users.get(g.uuid) || []));
    if (!out.length) out.push(el("tr", null, el("td", { colSpan: 8, class: "muted" }, "NVML lists no GPU.")));
    return out;
  }

  function row(g, users) {
    const r = g.reading;
    const migs = r && Array.isArray(r.mig) && r.mig.length ? r.mig.map((m) => m.profile) : null;
    const id = el(
      "td",
      null,
      el("div", { class: "big" }, String(g.index)),
      small(el("span", { title: g.uuid + "\n" + g.pci_bus_id }, g.name)),
      migs ? small("MIG: " + migs.join(", ")) : null,
    );
    if (!g.up || !r) {
      const why = "down: " + (g.down_reason || "no reading") + "; last good sample " + clock(g.last_success);
      return el("tr", { class: "down" }, id, el("td", { colSpan: 7 }, why));
    }
    const prof = r.profiling;
    const hbm = ratioOf(r.memory_used_bytes, r.memory_total_bytes);
    return el(
      "tr",
      null,
      id,
      el(
        "td",
        { class: "num" },
        pct(r.utilization_ratio),
        bar(r.utilization_ratio),
        prof
          ? small("SM " + pct(prof.sm_active_ratio) + " \u00b7 tensor " + pct(prof.tensor_active_ratio))
          : null,
      ),
      el(
        "td",
        { class: "num" },
        gib(r.memory_used_bytes) + " / " + gib(r.memory_total_bytes) + " GiB",
        bar(hbm, hbm !== null && hbm >= 0.9),
      ),
      el(
        "td",
        { class: "num" },
        watts(r.power_watts) + " / " + watts(r.power_limit_watts) + " W",
        bar(ratioOf(r.power_watts, r.power_limit_watts)),
      ),
      el(
        "td",
        { class: "num" },
        celsius(r.temperature_celsius),
        isNum(r.memory_temperature_celsius) ? small("HBM " + celsius(r.memory_temperature_celsius)) : null,
      ),
      el("td", { class: "num" }, mhz(r.sm_clock_hz), throttles(r)),
      el("td", null, health(g, r)),
      el("td", null, usedBy(g, r, users)),
    );
  }

  function throttles(r) {
    if (!isNum(r.throttle_reasons)) return small(DASH);
    // gpu_idle is not a limit: the GPU has nothing to run
    const active = THROTTLE.filter(([bit, name]) => r.throttle_reasons & bit && name !== "gpu_idle");
    if (!active.length) return small("not throttled");
    const badges = active.map(([, name, serious]) => {
      const secs = r.throttle_seconds && r.throttle_seconds[name];
      const title = isNum(secs) ? duration(secs) + " in this state since the driver loaded" : undefined;
      return badge(words(name), serious ? "bad" : "", title);
    });
    return el("div", null, badges);
  }

  function health(g, r) {
    const out = [];
    for (const x of Array.isArray(g.xids) ? g.xids : []) {
      const cls = x.severity === "critical" ? "bad" : x.severity === "warning" ? "warn" : "info";
      const title = [x.description, x.action, "last " + clock(x.last)].filter(Boolean).join("\n");
      out.push(badge("XID " + x.code + " \u00d7" + x.count, cls, title));
    }
    if (r.ecc_uncorrected_errors > 0) out.push(badge("ECC uncorrected " + r.ecc_uncorrected_errors, "bad"));
    if (r.row_remap_failure) out.push(badge("row remap failed", "bad"));
    else if (r.row_remap_pending) out.push(badge("row remap pending", "warn", "reset the GPU to apply it"));
    return out.length ? out : small("no XIDs");
  }

  function usedBy(g, r, users) {
    const out = users.map((u) => badge(u, "info", "reports through the gpumon SDK"));
    const owned = g.owner;
    const o = owned && owned.owner;
    if (o && o.pod) {
      const pod = "pod " + o.namespace + "/" + o.pod + (o.container ? " (" + o.container + ")" : "");
      out.push(el("div", null, pod));
    }
    if (o && o.slurm_job_id) out.push(el("div", null, "Slurm job " + o.slurm_job_id));
    const procs = Array.isArray(r.processes) ? r.processes : null;
    const names = new Map(((owned && owned.processes) || []).map((p) => [p.pid, p]));
    if (procs && procs.length) {
      const biggest = procs.slice().sort((a, b) => (b.used_memory_bytes || 0) - (a.used_memory_bytes || 0));
      const lines = biggest.slice(0, 4).map((p) => {
        const who = names.get(p.pid) || {};
        const text = "pid " + p.pid + " " + (who.name || "?") + (who.user ? " (" + who.user + ")" : "");
        const title = who.container_id ? "container " + who.container_id : undefined;
        return el(
          "li",
          { title },
          text,
          " ",
          el("span", { class: "muted" }, gib(p.used_memory_bytes) + " GiB"),
        );
      });
      if (biggest.length > 4) lines.push(el("li", { class: "muted" }, "+" + (biggest.length - 4) + " more"));
      out.push(el("ul", { class: "plain small" }, lines));
    }
    if (!out.length) return small(procs ? "idle: no processes" : DASH);
    return out;
  }

  return { facts, rows };
})();
