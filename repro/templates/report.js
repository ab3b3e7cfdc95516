"use strict";
// The case grid of a run report: one cell per case, filters, and the case details.
// Every run string reaches the page through textContent (or a property such as
// title); never through innerHTML, so an exception message stays text.
(function () {
  const data = JSON.parse(document.getElementById("run-data").textContent);
  const T = data.targets, AX = data.axes, V = data.values, P = data.pool;
  const BAD = data.bad_verdicts, OUTCOMES = data.outcomes;
  const ix = Object.fromEntries(AX.map((a, i) => [a, i]));

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  const pooled = (i) => (i === undefined || i < 0 ? null : P[i]);
  const outcomeClass = (o) => "o-" + (OUTCOMES.includes(o) || o === "missing" ? o : "other");

  function record(c, t) {
    const r = c.recs[t];
    if (!r) return null;
    return {outcome: r[0], verdict: r[1], note: pooled(r[2]), error: pooled(r[3]), details: pooled(r[4]),
            known: pooled(r[5]), checks: pooled(r[6]), duration: r[7]};
  }

  function script(caseId, target) {
    // The same substitution as harness/script.py: each token becomes a JSON string literal.
    return data.script.template.split(data.script.case_token).join(JSON.stringify(caseId))
      .split(data.script.target_token).join(JSON.stringify(target));
  }

  const cases = data.cases.map(([id, ax, expected, effect, reason, recs], index) =>
    ({id, ax, expected, effect, reason, recs, index, cell: null}));

  // ---- the grid: rows pipeline x input, columns grad_mode x recompute, cells inside ----
  const groups = new Map();
  const rows = [], cols = [];
  for (const c of cases) {
    const row = c.ax[ix.pipeline] + "," + c.ax[ix.input], col = c.ax[ix.grad_mode] + "," + c.ax[ix.recompute];
    if (!groups.has(row)) { groups.set(row, new Map()); rows.push([c.ax[ix.pipeline], c.ax[ix.input]]); }
    if (!cols.some(([g, r]) => g + "," + r === col)) cols.push([c.ax[ix.grad_mode], c.ax[ix.recompute]]);
    const cell = groups.get(row);
    if (!cell.has(col)) cell.set(col, []);
    cell.get(col).push(c);
  }
  const byPair = (a, b) => a[0] - b[0] || a[1] - b[1];
  rows.sort(byPair);
  cols.sort(byPair);

  const grid = document.getElementById("case-grid");
  const head = el("tr");
  head.appendChild(el("th", null, "pipeline"));
  head.appendChild(el("th", null, "input"));
  for (const [g, r] of cols) {
    const th = el("th", "col");
    th.appendChild(el("div", null, V.grad_mode[g]));
    th.appendChild(el("div", null, V.recompute[r]));
    head.appendChild(th);
  }
  grid.appendChild(el("thead")).appendChild(head);
  const body = grid.appendChild(el("tbody"));
  for (const [p, i] of rows) {
    const tr = body.appendChild(el("tr"));
    tr.appendChild(el("th", null, V.pipeline[p]));
    tr.appendChild(el("th", null, V.input[i]));
    for (const [g, r] of cols) {
      const box = tr.appendChild(el("td")).appendChild(el("div", "cellbox"));
      for (const c of groups.get(p + "," + i).get(g + "," + r) || []) box.appendChild(makeCell(c));
    }
  }

  function makeCell(c) {
    const b = el("button", "cell");
    b.type = "button";
    b.title = c.id;
    b.dataset.caseId = c.id;
    T.forEach((_, t) => {
      const r = c.recs[t];
      const seg = b.appendChild(el("span", "seg " + outcomeClass(r ? r[0] : "missing")));
      seg.dataset.target = String(t);
    });
    if (c.recs.some((r) => r && BAD.includes(r[1]))) b.classList.add("bad");
    b.addEventListener("click", () => show(c));
    c.cell = b;
    return b;
  }

  // ---- filters ----
  const filters = document.getElementById("filters");
  const selects = {};
  function addSelect(name, label, options) {
    const wrap = filters.appendChild(el("label", null, label + " "));
    const s = wrap.appendChild(el("select"));
    s.id = "filter-" + name;
    s.appendChild(option("", "any"));
    for (const [value, text] of options) s.appendChild(option(value, text));
    s.addEventListener("change", apply);
    selects[name] = s;
  }
  function option(value, text) {
    const o = el("option", null, text);
    o.value = value;
    return o;
  }
  addSelect("target", "target", T.map((t, i) => [String(i), t]));
  addSelect("outcome", "outcome", [...OUTCOMES, "missing"].map((o) => [o, o]));
  addSelect("verdict", "verdict", [["attention", "needs attention"],
                                   ...data.verdicts.map((v) => [v, v])]);
  for (const a of AX) addSelect(a, a, V[a].map((v, i) => [String(i), v]));
  const skipWrap = filters.appendChild(el("label", null, " hide cases skipped everywhere"));
  const skipBox = el("input");
  skipBox.type = "checkbox";
  skipBox.id = "filter-hide-skipped";
  skipBox.addEventListener("change", apply);
  skipWrap.prepend(skipBox);
  const count = filters.appendChild(el("span", "count"));

  function apply() {
    const t = selects.target.value === "" ? null : Number(selects.target.value);
    const targets = t === null ? T.map((_, i) => i) : [t];
    const o = selects.outcome.value, v = selects.verdict.value;
    const want = AX.map((a) => (selects[a].value === "" ? null : Number(selects[a].value)));
    let shown = 0;
    for (const c of cases) {
      const recs = targets.map((i) => c.recs[i]);
      let ok = want.every((w, i) => w === null || c.ax[i] === w);
      if (ok && o) ok = recs.some((r) => (r ? r[0] : "missing") === o);
      if (ok && v) ok = recs.some((r) => r && (v === "attention" ? BAD.includes(r[1]) : r[1] === v));
      if (ok && skipBox.checked) ok = recs.some((r) => r && r[0] !== "skipped");
      c.cell.hidden = !ok;
      if (ok) shown += 1;
      for (const seg of c.cell.children) seg.hidden = t !== null && Number(seg.dataset.target) !== t;
    }
    count.textContent = shown + " of " + cases.length + " cases shown";
  }

  // ---- details of one case ----
  const panel = document.getElementById("details");
  let selected = null;
  function show(c) {
    if (selected) selected.cell.classList.remove("selected");
    selected = c;
    c.cell.classList.add("selected");
    panel.replaceChildren();
    panel.appendChild(el("h3", "case-id", c.id));
    const dl = panel.appendChild(el("dl", "axes"));
    AX.forEach((a, i) => {
      dl.appendChild(el("dt", null, a));
      dl.appendChild(el("dd", null, V[a][c.ax[i]]));
    });
    panel.appendChild(el("p", "oracle", "oracle: " + c.expected + (c.effect ? " (" + c.effect + ")" : "")
      + (c.reason ? ": " + c.reason : "")));
    T.forEach((target, t) => panel.appendChild(targetDetail(c, target, record(c, t))));
  }

  function targetDetail(c, target, r) {
    const sec = el("section", "target-detail");
    sec.dataset.target = target;
    sec.appendChild(el("h4", null, target));
    if (!r) {
      sec.appendChild(el("p", "outcome", "no result: missing from this run"));
    } else {
      const line = sec.appendChild(el("p", "outcome"));
      line.appendChild(el("span", "swatch-text " + outcomeClass(r.outcome), "\u00a0\u00a0"));
      line.appendChild(document.createTextNode(" outcome " + r.outcome + ", verdict "));
      line.appendChild(el("span", BAD.includes(r.verdict) ? "verdict-bad" : "verdict", r.verdict));
      if (r.duration) line.appendChild(document.createTextNode(", " + r.duration + " s"));
      if (r.checks && r.checks.length) sec.appendChild(el("p", "checks", "failed checks: " + r.checks.join(", ")));
      if (r.note) sec.appendChild(el("p", "note", r.note));
      if (r.error) {
        sec.appendChild(el("p", "error-head", "error: " + r.error.type + " at "
          + (r.error.location || "(no TE frame)")));
        sec.appendChild(el("pre", "error-message", r.error.message));
        if (r.error.traceback) {
          const tb = sec.appendChild(el("details", "traceback"));
          tb.appendChild(el("summary", null, "traceback"));
          tb.appendChild(el("pre", null, r.error.traceback));
        }
      }
      for (const [check, lines] of Object.entries(r.details || {})) {
        sec.appendChild(el("p", null, check + ":"));
        const ul = sec.appendChild(el("ul", "detail-lines"));
        for (const l of lines) ul.appendChild(el("li", null, l));
      }
      if (r.known && r.known.length) {
        sec.appendChild(el("p", null, "known deviations (recorded, not failures):"));
        const ul = sec.appendChild(el("ul", "known"));
        for (const l of r.known) ul.appendChild(el("li", null, l));
      }
    }
    const rep = sec.appendChild(el("details", "script"));
    rep.appendChild(el("summary", null, "reproduction script"));
    rep.appendChild(el("p", null, "repro show " + c.id + " --target " + target + " --script > case.py && python case.py"));
    rep.appendChild(el("pre", "script-text", script(c.id, target)));
    return sec;
  }

  apply();
  document.getElementById("grid-status").textContent = cases.length + " cases, " + T.length + " targets";
})();
