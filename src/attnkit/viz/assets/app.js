// attnkit view: (c) the overview grid and the page: layer/head selectors, the three tabs.

const STATE = { layer: 0, head: 0, view: "head", detail: "head" };
const OV = { built: false };

function buildOverview() {
  const grid = $("ov-grid");
  grid.style.gridTemplateColumns = `auto repeat(${H}, minmax(0, 120px))`;
  const [off, len] = META.thumbs.block;
  const [tq, tk] = META.thumbs.shape;
  const frag = document.createDocumentFragment();
  const cells = [];
  frag.appendChild(document.createElement("div"));
  for (let h = 0; h < H; h++) {
    const d = document.createElement("div");
    d.className = "ov-col";
    d.textContent = label("head", META.heads[h]);
    frag.appendChild(d);
  }
  for (let l = 0; l < N; l++) {
    const row = document.createElement("div");
    row.className = "ov-row";
    row.textContent = label("layer", META.layers[l]);
    frag.appendChild(row);
    for (let h = 0; h < H; h++) {
      const cell = document.createElement("button");
      cell.type = "button";
      cell.className = "ov-cell";
      cell.title = `${label("layer", META.layers[l])}, ${label("head", META.heads[h])}: click to open`;
      cell.dataset.layer = String(l);
      cell.dataset.head = String(h);
      const c = document.createElement("canvas");
      c.width = tk;
      c.height = tq;
      cell.appendChild(c);
      cell.addEventListener("click", () => {
        select(l, h);
        setView(STATE.detail);
      });
      frag.appendChild(cell);
      cells.push(c);
    }
  }
  grid.appendChild(frag);
  OV.built = true;
  return inflate(BLOB.subarray(off, off + len)).then((codes) => {
    cells.forEach((c, n) => {
      const ctx = c.getContext("2d");
      const img = ctx.createImageData(tk, tq);
      const base = n * tq * tk;
      const px = img.data;
      for (let p = 0; p < tq * tk; p++) {
        const c = 4 * codes[base + p];
        px[4 * p] = LUT[c];
        px[4 * p + 1] = LUT[c + 1];
        px[4 * p + 2] = LUT[c + 2];
        px[4 * p + 3] = 255;
      }
      ctx.putImageData(img, 0, 0);
    });
    markCurrent();
  });
}

function markCurrent() {
  for (const cell of document.querySelectorAll(".ov-cell")) {
    const on = Number(cell.dataset.layer) === STATE.layer && Number(cell.dataset.head) === STATE.head;
    cell.classList.toggle("current", on);
  }
}

// "layer 3" for a bare number; a label that already says what it is ("decoder layer 3") as is.
function label(prefix, lab) {
  return /^\d+$/.test(lab) ? `${prefix} ${lab}` : lab;
}

function fillSelect(sel, labels, prefix) {
  labels.forEach((lab, n) => {
    const o = document.createElement("option");
    o.value = String(n);
    o.textContent = label(prefix, lab);
    sel.appendChild(o);
  });
}

function select(l, h) {
  STATE.layer = l;
  STATE.head = h;
  $("sel-layer").value = String(l);
  $("sel-head").value = String(h);
  markCurrent();
}

function setView(view) {
  STATE.view = view;
  if (view !== "overview") STATE.detail = view;
  for (const v of ["head", "matrix", "overview"]) {
    $(v === "head" ? "headview" : v).hidden = v !== view;
    $("tab-" + v).setAttribute("aria-selected", String(v === view));
  }
  $("selectors").hidden = view === "overview";
  return refresh();
}

function refresh() {
  let p;
  if (STATE.view === "head") p = showHeadView();
  else if (STATE.view === "matrix") {
    sizeMatrix();
    p = showMatrix();
  } else p = OV.built ? Promise.resolve() : buildOverview();
  return p.then(() => {
    document.body.dataset.drawn = `${STATE.view}:${STATE.layer}:${STATE.head}`;
    // milliseconds from the start of navigation to the first complete drawing
    if (!document.body.dataset.firstDrawMs) document.body.dataset.firstDrawMs = String(Math.round(performance.now()));
  }).catch(fail);
}

function fail(err) {
  $("status").textContent = "could not show the attention: " + err;
  console.error(err);
}

// Tabs for the page's kinds of attention; choosing one reloads the page on it.
function buildSections() {
  if (SECTIONS.length < 2) return;
  const nav = $("sections");
  const lead = document.createElement("span");
  lead.className = "hint";
  lead.textContent = "attention:";
  nav.appendChild(lead);
  SECTIONS.forEach((sec, n) => {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "section";
    b.textContent = sec.name || `part ${n + 1}`;
    b.setAttribute("aria-current", String(n === SECTION));
    b.addEventListener("click", () => {
      if (n === SECTION) return;
      location.hash = `section-${n}`;
      location.reload();
    });
    nav.appendChild(b);
  });
  nav.hidden = false;
}

function start() {
  const title = META.title || "attention";
  $("title").textContent = title;
  const sub = [`${N} layer${N > 1 ? "s" : ""} \u00d7 ${H} head${H > 1 ? "s" : ""}`,
    `${LQ} query \u00d7 ${LK} key tokens`, `weights stored with ${META.bits} bits per entry`];
  if (META.cross && !META.name) sub.push("cross-attention");
  $("subtitle").textContent = sub.join(" \u00b7 ");
  if (META.note) {
    $("note").textContent = META.note;
    $("note").hidden = false;
  }
  buildSections();
  fillSelect($("sel-layer"), META.layers, "layer");
  fillSelect($("sel-head"), META.heads, "head");
  $("sel-layer").addEventListener("change", (ev) => { select(Number(ev.target.value), STATE.head); refresh(); });
  $("sel-head").addEventListener("change", (ev) => { select(STATE.layer, Number(ev.target.value)); refresh(); });
  for (const v of ["head", "matrix", "overview"]) $("tab-" + v).addEventListener("click", () => setView(v));
  window.addEventListener("resize", () => { if (STATE.view === "matrix") { sizeMatrix(); requestDraw(); } else drawHeadView(); });
  $("status").textContent = "";
  setView(Math.max(LQ, LK) <= 256 ? "head" : "matrix");
}

// A small scripting handle (used by the tests): the state, and where a matrix cell is.
window.attnkitView = { state: STATE, section: SECTION, cellPoint: matrixCellPoint, select: (l, h) => { select(l, h); return refresh(); }, show: setView };

try {
  start();
} catch (err) {
  fail(err);
}
