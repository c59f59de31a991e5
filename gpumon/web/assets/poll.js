"use strict";
// The refresh loop: every few seconds (?refresh=SECONDS) read /v1/gpus and, where the daemon tracks jobs,
// /v1/jobs with each job's detail; redraw; and say in the status line when the answers are stale. A failed
// refresh keeps the last data drawn, and nothing is ever thrown to the console.
(() => {
  const { isNum, clock, duration, labelCells } = gpumonKit;
  const body = document.body;
  const JOBS_ON = body.dataset.jobs === "on";
  const asked = Number(new URLSearchParams(location.search).get("refresh"));
  const seconds = asked > 0 ? asked : Number(body.dataset.refresh) || 3;
  const REFRESH_MS = 1000 * Math.min(300, Math.max(0.5, seconds));
  const TIMEOUT_MS = Math.max(10000, 2 * REFRESH_MS);
  // location.origin never carries user:password, and a fetch of a URL with credentials in it throws: a
  // page opened with user:password in its address must not resolve relative URLs against that address
  const ORIGIN = location.origin;
  const $ = (id) => document.getElementById(id);
  const state = { gpus: null, jobs: null, gpusAt: null, sweep: null, sweepSince: null };

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function getJSON(path) {
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), TIMEOUT_MS);
    try {
      let response;
      try {
        // X-Gpumon-Page: a 401 comes without a challenge, so the browser shows no sign-in prompt that
        // this fetch would wait on; the page says 401 instead (gpumon/web/guard.py)
        const headers = { Accept: "application/json", "X-Gpumon-Page": "1" };
        response = await fetch(ORIGIN + path, { signal: abort.signal, cache: "no-store", headers });
      } catch (e) {
        throw new ApiError(0, e && e.name === "AbortError" ? "no answer in time" : "daemon unreachable");
      }
      if (!response.ok) {
        let detail = "";
        try {
          detail = String((await response.json()).detail || "");
        } catch (e) {
          detail = ""; // not JSON: a proxy's page, the guard's plain text
        }
        throw new ApiError(response.status, explain(response.status, detail));
      }
      try {
        return await response.json();
      } catch (e) {
        throw new ApiError(0, "the answer is not JSON");
      }
    } finally {
      clearTimeout(timer);
    }
  }

  function explain(status, detail) {
    if (status === 401) return "401 unauthorized: reload the page to sign in again";
    if (status === 429) return "429: the web config's rate limit refused the refresh";
    if (status === 503) return "503: " + (detail || "not ready");
    return "HTTP " + status + (detail ? ": " + detail : "");
  }

  async function loadGpus() {
    const doc = await getJSON("/v1/gpus");
    if (!doc || !Array.isArray(doc.gpus)) throw new ApiError(0, "the answer is not a gpumon snapshot");
    return doc;
  }

  async function loadJobs() {
    // one request for every job's detail: a refresh is two requests however many jobs there are, which
    // matters under the web config's rate limit
    const list = await getJSON("/v1/jobs?detail=true");
    if (!list || !Array.isArray(list.jobs)) throw new ApiError(0, "the answer is not a list of jobs");
    const jobs = list.jobs.map((summary) => ({ summary, detail: summary.detail || null }));
    jobs.sort((a, b) => String(a.summary.job).localeCompare(String(b.summary.job)));
    return { window: list.window_seconds, jobs };
  }

  function draw() {
    const jobs = state.jobs ? state.jobs.jobs : [];
    if (state.gpus) {
      $("node-facts").replaceChildren(...gpumonGpus.facts(state.gpus));
      $("gpu-rows").replaceChildren(...gpumonGpus.rows(state.gpus, gpumonJobs.users(jobs)));
      labelCells($("gpu-rows"));
    }
    if (JOBS_ON && state.jobs) {
      $("jobs-window").replaceChildren("rates over the last " + duration(state.jobs.window));
      $("job-rows").replaceChildren(...gpumonJobs.rows(jobs));
      labelCells($("job-rows"));
    }
  }

  function setStatus(errors) {
    const status = $("status");
    const interval = state.gpus && isNum(state.gpus.interval_seconds) ? state.gpus.interval_seconds : 1;
    const stalledFor = state.sweepSince === null ? 0 : (Date.now() - state.sweepSince) / 1000;
    const stalled = stalledFor > 3 * interval + REFRESH_MS / 1000;
    $("gpus").classList.toggle("stale", stalled || errors.some((e) => e.what === "GPUs"));
    $("jobs").classList.toggle(
      "stale",
      errors.some((e) => e.what === "jobs"),
    );
    const at = (ms) => new Date(ms).toLocaleTimeString();
    if (errors.length) {
      const have = state.gpusAt ? "showing data from " + at(state.gpusAt) : "no data yet";
      status.className = "status error";
      status.textContent =
        "stale: " + errors.map((e) => e.what + ": " + e.message).join("; ") + " \u2013 " + have;
    } else if (stalled) {
      status.className = "status error";
      status.textContent = "stale: no new sample for " + stalledFor.toFixed(0) + " s (is the sampler stuck?)";
    } else {
      status.className = "status ok";
      status.textContent =
        "live \u00b7 sample " +
        state.sweep +
        " at " +
        clock(state.gpus.timestamp) +
        " \u00b7 refreshed " +
        at(state.gpusAt) +
        ", every " +
        REFRESH_MS / 1000 +
        " s";
    }
  }

  async function refresh() {
    const errors = [];
    const failed = (what) => (e) =>
      errors.push({ what, message: e instanceof ApiError ? e.message : String(e) });
    const work = [
      loadGpus().then((doc) => {
        state.gpus = doc;
        state.gpusAt = Date.now();
        if (doc.sweep !== state.sweep) {
          state.sweep = doc.sweep;
          state.sweepSince = Date.now();
        }
      }, failed("GPUs")),
    ];
    if (JOBS_ON) work.push(loadJobs().then((jobs) => (state.jobs = jobs), failed("jobs")));
    await Promise.all(work);
    try {
      draw();
    } catch (e) {
      // a document this page does not understand: say so on the page, keep polling
      errors.push({ what: "page", message: "cannot draw the answer (" + (e && e.message) + ")" });
    }
    setStatus(errors);
    body.dataset.refreshes = String(Number(body.dataset.refreshes || 0) + 1); // tests wait on it
  }

  let timer = null;
  let running = false;
  async function loop() {
    clearTimeout(timer);
    if (running) return; // the refresh in flight schedules the next one
    running = true;
    try {
      await refresh();
    } catch (e) {
      $("status").className = "status error";
      $("status").textContent = "page error: " + (e && e.message);
    } finally {
      running = false;
    }
    if (!document.hidden) timer = setTimeout(loop, REFRESH_MS);
  }
  // a background tab stops polling; coming back refreshes at once
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) loop();
    else clearTimeout(timer);
  });
  loop();
})();
