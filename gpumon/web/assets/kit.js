"use strict";
// The node page's toolkit: building DOM from untrusted data, and units. Every string from the API (job
// names, process names, owners) reaches the page as a Text node or a property such as title, never as
// markup. The page's scripts are ASCII (other characters as \u escapes), so their CSP hashes do not depend
// on how the page is decoded.
const gpumonKit = (() => {
  const DASH = "\u2013";
  const isNum = (v) => typeof v === "number" && Number.isFinite(v);

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === undefined || value === null) continue;
      if (key === "class") node.className = value;
      else if (["title", "href", "colSpan", "open", "type", "ariaExpanded"].includes(key)) node[key] = value;
      else node.dataset[key] = String(value);
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }
  const small = (...children) => el("div", { class: "small" }, ...children);
  const badge = (text, cls, title) => el("span", { class: "badge " + (cls || ""), title }, text);
  function bar(ratio, hot) {
    const fill = el("div");
    // through the CSSOM, which the CSP's style-src does not govern (a style attribute it would refuse)
    fill.style.width = (isNum(ratio) ? Math.max(0, Math.min(1, ratio)) * 100 : 0) + "%";
    return el("div", { class: hot ? "bar hot" : "bar" }, fill);
  }

  // each cell's column name in data-label, which the narrow layout shows beside it (page.css); a cell
  // spanning columns gets none
  function labelCells(tbody) {
    const names = Array.from(tbody.parentElement.tHead.rows[0].cells, (th) => th.textContent);
    for (const row of tbody.rows) {
      let column = 0;
      for (const cell of row.cells) {
        if (cell.colSpan === 1) cell.dataset.label = names[column];
        column += cell.colSpan;
      }
    }
  }

  // the API speaks bytes, ratios, watts, seconds
  const pct = (r, digits = 0) => (isNum(r) ? (r * 100).toFixed(digits) + " %" : DASH);
  const gib = (b) => (isNum(b) ? (b / 2 ** 30).toFixed(1) : DASH);
  const watts = (w) => (isNum(w) ? w.toFixed(0) : DASH);
  const celsius = (c) => (isNum(c) ? c.toFixed(0) + " \u00b0C" : DASH);
  const mhz = (hz) => (isNum(hz) ? (hz / 1e6).toFixed(0) + " MHz" : DASH);
  const times = (r) => (isNum(r) ? "\u00d7" + r.toFixed(2) : DASH);
  const clock = (t) => (isNum(t) ? new Date(t * 1000).toLocaleTimeString() : DASH);
  const ratioOf = (a, b) => (isNum(a) && isNum(b) && b > 0 ? a / b : null);
  const words = (name) => String(name).replace(/_/g, " ");
  function duration(s) {
    if (!isNum(s)) return DASH;
    if (s < 1) return (s * 1000).toFixed(s < 0.01 ? 2 : 0) + " ms";
    // 1.43 s, 60 s: two decimals at most, no trailing zeros
    return s < 120 ? Number(s.toFixed(2)) + " s" : Number((s / 60).toFixed(1)) + " min";
  }
  function si(v) {
    if (!isNum(v)) return DASH;
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(2) + " G";
    if (a >= 1e6) return (v / 1e6).toFixed(2) + " M";
    if (a >= 1e3) return (v / 1e3).toFixed(1) + " k";
    return v.toFixed(a >= 100 || a === 0 ? 0 : 1);
  }

  return {
    DASH,
    isNum,
    el,
    small,
    badge,
    bar,
    labelCells,
    pct,
    gib,
    watts,
    celsius,
    mhz,
    times,
    clock,
    ratioOf,
    words,
    duration,
    si,
  };
})();
