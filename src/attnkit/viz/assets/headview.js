// attnkit view: (a) the head view. Query tokens on the left, key tokens on the right, a line
// from query i to key j with opacity = weight(i, j). Long inputs draw each query's top-k lines
// (k adjustable); hovering a token isolates its lines (all of them) and shows its weights.
// Only the rows in view are drawn: the canvas stays the size of the scrolling box.

const ROW = 18; // px per token row
const HV = {
  scroll: $("hv-scroll"),
  canvas: $("hv-canvas"),
  left: $("hv-left"),
  right: $("hv-right"),
  readout: $("hv-readout"),
  idle: $("hv-readout").textContent, // the hint shown while no token is hovered
  k: $("hv-k"),
  hd: null,
  focus: null, // ["q" | "k", index] while a token is hovered
  built: false,
  shadeKey: "",
};

function buildColumns() {
  const height = Math.max(LQ, LK) * ROW + 4;
  $("hv-inner").style.height = height + "px";
  HV.scroll.style.height = Math.min(height + 2, Math.max(240, window.innerHeight * 0.7)) + "px";
  for (const [col, toks, side] of [[HV.left, QT, "q"], [HV.right, KT, "k"]]) {
    const frag = document.createDocumentFragment();
    toks.forEach((tok, i) => {
      const span = document.createElement("span");
      span.className = "tok";
      span.textContent = tok;
      span.style.top = i * ROW + "px";
      span.dataset.side = side;
      span.dataset.index = String(i);
      frag.appendChild(span);
    });
    col.appendChild(frag);
  }
  const onOver = (ev) => {
    const t = ev.target;
    if (!t.dataset || !t.dataset.side) return;
    HV.focus = [t.dataset.side, Number(t.dataset.index)];
    focusReadout();
    drawHeadView();
  };
  const onOut = () => {
    HV.focus = null;
    HV.readout.textContent = HV.idle;
    drawHeadView();
  };
  for (const col of [HV.left, HV.right]) {
    col.addEventListener("mouseover", onOver);
    col.addEventListener("mouseleave", onOut);
  }
  HV.scroll.addEventListener("scroll", () => requestAnimationFrame(drawHeadView));
  HV.k.max = String(LK);
  HV.k.value = String(Math.min(LK, LK <= 64 ? LK : 5));
  HV.k.addEventListener("change", drawHeadView);
  HV.built = true;
}

async function showHeadView() {
  if (!HV.built) buildColumns();
  const key = STATE.layer * H + STATE.head;
  const hd = await loadHead(STATE.layer, STATE.head);
  if (STATE.layer * H + STATE.head !== key) return;
  HV.hd = hd;
  if (HV.focus) focusReadout();
  drawHeadView();
}

function topK() {
  const k = Math.floor(Number(HV.k.value));
  return Number.isFinite(k) ? Math.min(Math.max(k, 1), LK) : 5;
}

function focusReadout() {
  const hd = HV.hd;
  if (!hd || !HV.focus) return;
  const [side, idx] = HV.focus;
  const parts = [];
  if (side === "q") {
    for (const j of topKeys(hd, idx, 5)) parts.push(`\u201c${KT[j]}\u201d ${formatWeight(weightOf(hd, idx, j))}`);
    HV.readout.textContent = `query ${idx} \u201c${QT[idx]}\u201d attends to: ${parts.join(", ") || "nothing"}`;
  } else {
    const rows = [];
    for (let i = 0; i < LQ; i++) rows.push([weightOf(hd, i, idx), i]);
    rows.sort((a, b) => b[0] - a[0]);
    for (const [w, i] of rows.slice(0, 5)) if (w > 0) parts.push(`\u201c${QT[i]}\u201d ${formatWeight(w)}`);
    HV.readout.textContent = `key ${idx} \u201c${KT[idx]}\u201d is attended by: ${parts.join(", ") || "nothing"}`;
  }
}

function drawHeadView() {
  const hd = HV.hd;
  if (!hd || STATE.view !== "head") return;
  const c = HV.canvas;
  const w = c.clientWidth;
  const h = HV.scroll.clientHeight;
  const dpr = window.devicePixelRatio || 1;
  if (c.width !== Math.floor(w * dpr) || c.height !== Math.floor(h * dpr)) {
    c.width = Math.floor(w * dpr);
    c.height = Math.floor(h * dpr);
    c.style.height = h + "px";
  }
  const ctx = c.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const top = HV.scroll.scrollTop;
  const lo = top - ROW;
  const hi = top + h + ROW;
  const yOf = (i) => i * ROW + ROW / 2 - top;
  ctx.lineWidth = HV.focus ? 2 : 1.5;
  ctx.strokeStyle = "rgb(31, 119, 180)";
  const line = (i, j, wt) => {
    ctx.globalAlpha = Math.min(1, wt);
    ctx.beginPath();
    ctx.moveTo(0, yOf(i));
    ctx.lineTo(w, yOf(j));
    ctx.stroke();
  };
  const shade = new Float64Array(HV.focus ? (HV.focus[0] === "q" ? LK : LQ) : 0);
  if (HV.focus) {
    const [side, idx] = HV.focus;
    if (side === "q") {
      for (let j = 0; j < LK; j++) {
        const wt = weightOf(hd, idx, j);
        shade[j] = wt;
        if (wt > 0) line(idx, j, wt);
      }
    } else {
      for (let i = 0; i < LQ; i++) {
        const wt = weightOf(hd, i, idx);
        shade[i] = wt;
        if (wt > 0) line(i, idx, wt);
      }
    }
  } else {
    const rows = topPerQuery(hd, topK());
    for (let i = 0; i < LQ; i++) {
      const yi = i * ROW;
      for (const j of rows[i]) {
        const yj = j * ROW;
        if ((yi < lo || yi > hi) && (yj < lo || yj > hi)) continue;
        line(i, j, weightOf(hd, i, j));
      }
    }
  }
  ctx.globalAlpha = 1;
  const sk = HV.focus ? `${HV.focus.join()}/${STATE.layer}/${STATE.head}` : "";
  if (sk !== HV.shadeKey) {
    HV.shadeKey = sk;
    shadeTokens(shade);
  }
}

// While a token is hovered, the other column's tokens are shaded by their weight.
function shadeTokens(shade) {
  const other = !HV.focus ? null : HV.focus[0] === "q" ? HV.right : HV.left;
  for (const col of [HV.left, HV.right]) {
    const spans = col.children;
    for (let n = 0; n < spans.length; n++) {
      const s = spans[n];
      const idx = Number(s.dataset.index);
      const on = HV.focus && s.dataset.side === HV.focus[0] && idx === HV.focus[1];
      s.classList.toggle("focus", Boolean(on));
      const a = col === other ? Math.min(1, shade[idx]) : 0;
      s.style.backgroundColor = a > 0 ? `rgba(31, 119, 180, ${a.toFixed(3)})` : "";
    }
  }
}
