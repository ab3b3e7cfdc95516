"use strict";
// The case grid of a run report: cells by row and column, filters, keyboard movement, and
// the cases of a cell. Every run string reaches the page through textContent (or a property
// such as aria-label); never through innerHTML, so an exception message stays text.
(function () {
  const data = JSON.parse(document.getElementById("run-data").textContent);
  const T = data.targets, AX = data.axes, V = data.values, P = data.pool;
  const OUT = data.outcomes, VER = data.verdicts, BAD = data.bad_verdicts;
  const ix = Object.fromEntries(AX.map((a, i) => [a, i]));
  const GLYPH_V = {fixed: "✓", reproduced: "R", other_failure: "!", regression: "!", unexpected_pass: "U",
                   harness_error: "H", not_applicable: "–", skipped: "·", missing: "?"};
  const GLYPH_O = {crash: "C", wrong_output: "O", wrong_grad: "G", side_effect: "S", harness_error: "H",
                   not_applicable: "–", skipped: "·", missing: "?"};

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  // ---- unpack the cases: one axis code, then (outcome*verdicts+verdict, pool index) per target ----
  const stride = 1 + 2 * T.length, cases = [], explicitIds = new Map(data.ids);
  for (let n = 0; n * stride < data.cases.length; n++) {
    const at = n * stride;
    let code = data.cases[at];
    const ax = new Array(AX.length);
    for (let a = AX.length - 1; a >= 0; a--) { ax[a] = code % V[a].length; code = Math.floor(code / V[a].length); }
    const recs = T.map((_, t) => {
      const c = data.cases[at + 1 + 2 * t];
      if (c < 0) return null;
      return {outcome: OUT[Math.floor(c / VER.length)], verdict: VER[c % VER.length], extra: P[data.cases[at + 2 + 2 * t]]};
    });
    const id = explicitIds.get(n) || V[0][ax[0]] + ":" + AX.slice(1).map((a, i) => V[i + 1][ax[i + 1]]).join("-");
    cases.push({id, ax, recs});
  }
  const varying = AX.map((_, a) => V[a].length > 1);
  // regression and client head the rows only when the run holds more than one of them
  const rowAxes = ["regression", "client", "pipeline", "input"].filter(
    (a) => a in ix && (varying[ix[a]] || (a !== "regression" && a !== "client")));
  const colAxes = ["grad_mode", "recompute"].filter((a) => a in ix);
  const otherAxes = AX.filter((a) => !rowAxes.includes(a) && !colAxes.includes(a) && varying[ix[a]]);
  const keyOf = (c, axes) => axes.map((a) => c.ax[ix[a]]).join(",");
  const label = (c, axes) => axes.map((a) => V[ix[a]][c.ax[ix[a]]]).join(", ");

  // ---- rows and columns: only combinations that hold a case ----
  const rowMap = new Map(), colMap = new Map(), cellMap = new Map();
  for (const c of cases) {
    const r = keyOf(c, rowAxes), k = keyOf(c, colAxes);
    if (!rowMap.has(r)) rowMap.set(r, c);
    if (!colMap.has(k)) colMap.set(k, c);
    const key = r + "|" + k;
    if (!cellMap.has(key)) cellMap.set(key, []);
    cellMap.get(key).push(c);
  }
  const order = (axes) => (x, y) => {
    for (const a of axes) { const d = x[1].ax[ix[a]] - y[1].ax[ix[a]]; if (d) return d; }
    return 0;
  };
  const rows = [...rowMap].sort(order(rowAxes)), cols = [...colMap].sort(order(colAxes));

  const grid = document.getElementById("case-grid");
  const head = grid.appendChild(el("thead")).appendChild(el("tr"));
  const corner = head.appendChild(el("th", "corner", rowAxes.join(" × ") + " \\ " + colAxes.join(" × ")));
  corner.scope = "col";
  const colHeads = cols.map(([, c]) => {
    const th = head.appendChild(el("th", "col"));
    th.scope = "col";
    for (const a of colAxes) th.appendChild(el("div", null, V[ix[a]][c.ax[ix[a]]]));
    return th;
  });
  const body = grid.appendChild(el("tbody"));
  const cells = [];  // [row][col] -> td
  const rowEls = rows.map(([rk, rc], r) => {
    const tr = body.appendChild(el("tr"));
    const th = tr.appendChild(el("th", null, label(rc, rowAxes)));
    th.scope = "row";
    cells[r] = cols.map(([ck, cc], k) => {
      const td = tr.appendChild(el("td"));
      td.setAttribute("role", "gridcell");
      td.tabIndex = -1;
      td.dataset.row = String(r);
      td.dataset.col = String(k);
      td.cases = cellMap.get(rk + "|" + ck) || [];
      td.where = label(rc, rowAxes) + "; " + label(cc, colAxes);
      td.addEventListener("click", () => { focusCell(td); select(td); });
      return td;
    });
    return tr;
  });

  // ---- filters, colour mode, legend ----
  const filters = document.getElementById("filters"), selects = {};
  function addSelect(name, text, options, first) {
    const wrap = filters.appendChild(el("label", null, text + " "));
    const s = wrap.appendChild(el("select"));
    s.id = "filter-" + name;
    for (const [value, shown] of (first ? [first] : [["", "any"]]).concat(options)) {
      const o = s.appendChild(el("option", null, shown));
      o.value = value;
    }
    s.addEventListener("change", apply);
    selects[name] = s;
  }
  addSelect("colour", "colour by", [["outcome", "outcome"]], ["verdict", "verdict"]);
  addSelect("target", "target", T.map((t, i) => [String(i), t]));
  addSelect("verdict", "verdict", [["attention", "needs a look"], ...VER.map((v) => [v, v])]);
  addSelect("outcome", "outcome", OUT.map((o) => [o, o]));
  AX.forEach((a, i) => { if (varying[i]) addSelect(a, a, V[i].map((v, j) => [String(j), v])); });
  const count = filters.appendChild(el("span", "count"));
  const legend = document.getElementById("legend");

  function drawLegend(mode) {
    legend.replaceChildren(el("span", null, "colours (" + mode + "):"));
    const names = mode === "verdict" ? VER.filter((v) => v !== "skipped") : OUT.filter((o) => o !== "skipped");
    for (const name of [...names, "missing"]) {
      const item = legend.appendChild(el("span"));
      const sw = item.appendChild(el("span", "stripe " + cls(mode, name), glyph(mode, name)));
      sw.setAttribute("aria-hidden", "true");
      item.appendChild(document.createTextNode(" " + name));
    }
  }
  const cls = (mode, name) => (mode === "verdict" ? "v-" : "o-") + name;
  const glyph = (mode, name) => ((mode === "verdict" ? GLYPH_V : GLYPH_O)[name] || "");
  const worstOf = (list, severity) => list.reduce((w, x) => (severity.indexOf(x) < severity.indexOf(w) ? x : w));

  let visibleCases = 0;
  function apply() {
    const mode = selects.colour.value;
    const t = selects.target.value === "" ? null : Number(selects.target.value);
    const targets = t === null ? T.map((_, i) => i) : [t];
    const v = selects.verdict.value, o = selects.outcome.value;
    const want = AX.map((a) => (selects[a] && selects[a].value !== "" ? Number(selects[a].value) : null));
    const match = (c) => {
      if (!want.every((w, i) => w === null || c.ax[i] === w)) return false;
      const recs = targets.map((i) => c.recs[i]);
      if (o && !recs.some((r) => (r ? r.outcome : "missing") === o)) return false;
      if (v && !recs.some((r) => r && (v === "attention" ? BAD.includes(r.verdict) : r.verdict === v))) return false;
      return true;
    };
    const rowUsed = rows.map(() => false), colUsed = cols.map(() => false);
    visibleCases = 0;
    cells.forEach((line, r) => line.forEach((td, k) => {
      td.shown = td.cases.filter(match);
      visibleCases += td.shown.length;
      td.replaceChildren();
      td.classList.toggle("empty", td.shown.length === 0);
      if (!td.shown.length) { td.setAttribute("aria-label", td.where + ": no case shown"); return; }
      rowUsed[r] = colUsed[k] = true;
      const box = td.appendChild(el("span", "stripes"));
      const parts = [];
      for (const i of targets) {
        const recs = td.shown.map((c) => c.recs[i]);
        const verdicts = recs.map((x) => (x ? x.verdict : "missing"));
        const outcomes = recs.map((x) => (x ? x.outcome : "missing"));
        const shown = mode === "verdict" ? worstOf(verdicts, [...VER, "missing"]) : worstOf(outcomes, [...OUT, "missing"]);
        const stripe = box.appendChild(el("span", "stripe " + cls(mode, shown), glyph(mode, shown)));
        stripe.dataset.target = T[i];
        const tally = new Map();
        recs.forEach((x, j) => { const key = verdicts[j] + " (" + outcomes[j] + ")"; tally.set(key, (tally.get(key) || 0) + 1); });
        parts.push(T[i] + ": " + [...tally].map(([key, n]) => n + " " + key).join(", "));
      }
      td.classList.toggle("bad", td.shown.some((c) => c.recs.some((x) => x && BAD.includes(x.verdict))));
      td.setAttribute("aria-label", td.where + ": " + td.shown.length + " cases; " + parts.join("; "));
    }));
    rowEls.forEach((tr, r) => { tr.hidden = !rowUsed[r]; });
    colHeads.forEach((th, k) => { th.hidden = !colUsed[k]; });
    cells.forEach((line) => line.forEach((td, k) => { td.hidden = !colUsed[k]; }));
    count.textContent = visibleCases + " of " + cases.length + " cases shown";
    drawLegend(mode);
    if (!current || current.hidden || current.parentElement.hidden || current.classList.contains("empty")) focusCell(firstCell());
    if (selected) select(selected);
  }

  // ---- one tab stop for the grid; arrow keys move between cells that hold cases ----
  let current = null;
  const usable = (td) => td && !td.hidden && !td.parentElement.hidden && !td.classList.contains("empty");
  function firstCell() {
    for (const line of cells) for (const td of line) if (usable(td)) return td;
    return null;
  }
  function focusCell(td, moveFocus) {
    if (!td) return;
    if (current) current.tabIndex = -1;
    current = td;
    td.tabIndex = 0;
    if (moveFocus) td.focus();
  }
  function step(td, dr, dc) {
    let r = Number(td.dataset.row), k = Number(td.dataset.col);
    for (;;) {
      r += dr; k += dc;
      if (r < 0 || r >= rows.length || k < 0 || k >= cols.length) return null;
      if (usable(cells[r][k])) return cells[r][k];
    }
  }
  grid.addEventListener("keydown", (event) => {
    const td = event.target.closest("td");
    if (!td) return;
    const moves = {ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1]};
    if (moves[event.key]) {
      const next = step(td, ...moves[event.key]);
      if (next) focusCell(next, true);
      event.preventDefault();
    } else if (event.key === "Enter" || event.key === " ") {
      select(td);
      event.preventDefault();
    }
  });

  // ---- the banner's links set the verdict filter ----
  for (const link of document.querySelectorAll("a.filter-link")) {
    link.addEventListener("click", () => {
      selects.verdict.value = link.dataset.verdict;
      apply();
      const td = firstCell();
      if (td) { focusCell(td); select(td); }
    });
  }

  // ---- the details panel: a cell's cases, then one case ----
  const panel = document.getElementById("details");
  let selected = null;
  function select(td) {
    if (selected) selected.classList.remove("selected");
    selected = td;
    td.classList.add("selected");
    panel.replaceChildren(el("h3", "cell-title", td.where));
    if (!td.shown || !td.shown.length) { panel.appendChild(el("p", null, "No case here under the current filters.")); return; }
    panel.appendChild(el("p", null, td.shown.length + " cases" + (otherAxes.length ? " (" + otherAxes.join(", ") + ")" : "")
      + "; select one for its details."));
    const list = panel.appendChild(el("ul", "case-list"));
    const mode = selects.colour.value;
    for (const c of td.shown) {
      const b = list.appendChild(el("li")).appendChild(el("button"));
      b.type = "button";
      b.dataset.caseId = c.id;
      T.forEach((target, i) => {
        const r = c.recs[i], name = r ? (mode === "verdict" ? r.verdict : r.outcome) : "missing";
        b.appendChild(el("span", "stripe " + cls(mode, name), glyph(mode, name))).setAttribute("aria-hidden", "true");
      });
      b.appendChild(el("span", null, otherAxes.map((a) => V[ix[a]][c.ax[ix[a]]]).join(" · ") || c.id));
      b.setAttribute("aria-label", c.id + ": " + T.map((target, i) => target + " " +
        (c.recs[i] ? c.recs[i].verdict + " (" + c.recs[i].outcome + ")" : "missing")).join("; "));
      b.addEventListener("click", () => showCase(c));
    }
    if (td.shown.length === 1) showCase(td.shown[0]);
  }

  function showCase(c) {
    for (const old of panel.querySelectorAll(".case-detail")) old.remove();
    const box = panel.appendChild(el("div", "case-detail"));
    box.appendChild(el("h3", "case-id", c.id));
    const dl = box.appendChild(el("dl", "axes"));
    AX.forEach((a, i) => { dl.appendChild(el("dt", null, a)); dl.appendChild(el("dd", null, V[i][c.ax[i]])); });
    T.forEach((target, t) => box.appendChild(targetDetail(c, target, c.recs[t])));
    box.scrollIntoView({block: "nearest"});
  }

  function list(parent, heading, lines, cls2) {
    if (!lines || !lines.length) return;
    parent.appendChild(el("p", null, heading));
    const ul = parent.appendChild(el("ul", cls2));
    for (const l of lines) ul.appendChild(el("li", null, l));
  }

  function targetDetail(c, target, r) {
    const sec = el("section", "target-detail");
    sec.dataset.target = target;
    sec.appendChild(el("h4", null, target + " (" + data.roles[T.indexOf(target)] + ")"));
    if (!r) {
      sec.appendChild(el("p", "outcome", "no result: missing from this run"));
    } else {
      const x = r.extra || {};
      const line = sec.appendChild(el("p", "outcome", "verdict "));
      line.appendChild(el("span", BAD.includes(r.verdict) ? "verdict-bad" : "verdict", r.verdict));
      line.appendChild(document.createTextNode(", outcome " + r.outcome + (x.expected ? ", expected " + x.expected : "")));
      if (x.verdict_reason) sec.appendChild(el("p", "reason", "why: " + x.verdict_reason));
      if (x.predicted) sec.appendChild(el("p", "predicted", "predicted: " + x.predicted));
      if (x.failed_checks) sec.appendChild(el("p", "checks", "failed checks: " + x.failed_checks.join(", ")));
      if (x.note) sec.appendChild(el("p", "note", x.note));
      if (x.error) {
        sec.appendChild(el("p", "error-head", "error: " + x.error.type + " at " + (x.error.location || "(no TE frame)")));
        sec.appendChild(el("pre", "error-message", x.error.message));
        if (x.error.traceback) {
          const tb = sec.appendChild(el("details", "traceback"));
          tb.appendChild(el("summary", null, "traceback"));
          tb.appendChild(el("pre", null, x.error.traceback));
        }
      }
      for (const [check, lines] of Object.entries(x.details || {})) list(sec, check + ":", lines, "detail-lines");
      list(sec, "side effects:", x.side_effects, "side-effects");
      list(sec, "known deviations (recorded, not failures):", x.known_deviations, "known");
    }
    const rep = sec.appendChild(el("details", "script"));
    rep.appendChild(el("summary", null, "reproduce"));
    // Standalone only where the record says one can be written (older runs: any case but a Megatron client's).
    const x0 = (r && r.extra) || {};
    const noStandalone = x0.standalone === false || (x0.standalone === undefined && c.id.indexOf(":megatron_") >= 0);
    rep.appendChild(el("pre", "script-text", noStandalone
      ? "repro show " + c.id + " --target " + target + " --script > case.py\npython case.py"
      : "repro show " + c.id + " --target " + target + " --script --standalone > case.py\n"
        + "repro exec --target " + target + " -- python case.py"));
    return sec;
  }

  apply();
})();
