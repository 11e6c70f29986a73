// attnkit view: (b) the matrix view. One offscreen canvas of Lk x Lq pixels per head, drawn
// through a zoom/pan transform (so zooming and panning cost one drawImage, at any length);
// token labels are drawn on the margins, thinned to what fits; the readout shows the weight,
// query token and key token under the cursor.

const ML = 120; // left margin (query tokens), CSS px
const MT = 96; // top margin (key tokens)
const MR = 76; // right margin (the colour bar)
const M = {
  canvas: $("m-canvas"),
  readout: $("m-readout"),
  idle: $("m-readout").textContent, // the hint shown while no cell is under the pointer
  img: null, // offscreen canvas of the current head
  hd: null,
  key: -1,
  z: 1, cx: 0, cy: 0, // zoom (px per cell) and the data coordinate at the plot's top-left
  drag: null,
  hover: null,
  width: 600, height: 600,
};

function headImage(hd) {
  const img = document.createElement("canvas");
  img.width = LK;
  img.height = LQ;
  const ctx = img.getContext("2d");
  const data = ctx.createImageData(LK, LQ);
  const px = data.data;
  const inv = hd.max > 0 ? 1 / hd.max : 0;
  for (let i = 0; i < LQ; i++) {
    const a = (hd.scale[i] * inv) / Q;
    const base = i * LK;
    for (let j = 0; j < LK; j++) {
      const c = (Math.sqrt(hd.codes[base + j] * a) * 255) | 0;
      const o = 4 * (base + j);
      px[o] = LUT[4 * c];
      px[o + 1] = LUT[4 * c + 1];
      px[o + 2] = LUT[4 * c + 2];
      px[o + 3] = 255;
    }
  }
  ctx.putImageData(data, 0, 0);
  return img;
}

function fitMatrix() {
  M.z = Math.min((M.width - ML - MR) / LK, (M.height - MT) / LQ);
  M.cx = 0;
  M.cy = 0;
}

function sizeMatrix() {
  const box = $("matrix").getBoundingClientRect();
  const top = M.canvas.getBoundingClientRect().top + window.scrollY;
  const w = Math.max(320, Math.floor(box.width));
  const h = Math.max(320, Math.min(Math.floor(window.innerHeight - top - 16), w));
  const dpr = window.devicePixelRatio || 1;
  M.canvas.width = Math.floor(w * dpr);
  M.canvas.height = Math.floor(h * dpr);
  M.canvas.style.width = w + "px";
  M.canvas.style.height = h + "px";
  const refit = M.width === 600 && M.height === 600;
  M.width = w;
  M.height = h;
  if (refit) fitMatrix();
}

async function showMatrix() {
  const key = STATE.layer * H + STATE.head;
  if (M.key !== key) {
    const hd = await loadHead(STATE.layer, STATE.head);
    if (STATE.layer * H + STATE.head !== key) return; // another head was chosen meanwhile
    M.hd = hd;
    M.img = headImage(hd);
    M.key = key;
  }
  drawMatrix();
}

function drawMatrix() {
  if (!M.img) return;
  const ctx = M.canvas.getContext("2d");
  const dpr = window.devicePixelRatio || 1;
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, M.width, M.height);
  ctx.save();
  ctx.beginPath();
  ctx.rect(ML, MT, M.width - ML - MR, M.height - MT);
  ctx.clip();
  ctx.imageSmoothingEnabled = M.z < 1;
  ctx.imageSmoothingQuality = "high";
  ctx.drawImage(M.img, ML - M.cx * M.z, MT - M.cy * M.z, LK * M.z, LQ * M.z);
  if (M.hover) {
    const [i, j] = M.hover;
    const s = Math.max(M.z, 3);
    ctx.strokeStyle = "#e4572e";
    ctx.lineWidth = 2;
    ctx.strokeRect(ML + (j - M.cx) * M.z - (s - M.z) / 2, MT + (i - M.cy) * M.z - (s - M.z) / 2, s, s);
  }
  ctx.restore();
  drawLabels(ctx);
  drawLegend(ctx);
}

// Colour bar at the right edge: 0 at the bottom, the head's largest weight at the top.
const LEGEND_W = 12;
function drawLegend(ctx) {
  const x = M.width - 64;
  const h = Math.min(M.height - MT - 8, 320);
  ctx.fillStyle = "#fff";
  ctx.fillRect(x - 6, MT - 14, 70, h + 28);
  for (let y = 0; y < h; y++) {
    const c = Math.round((255 * (h - 1 - y)) / (h - 1));
    ctx.fillStyle = `rgb(${LUT[4 * c]}, ${LUT[4 * c + 1]}, ${LUT[4 * c + 2]})`;
    ctx.fillRect(x, MT + y, LEGEND_W, 1);
  }
  ctx.fillStyle = "#222";
  ctx.font = "11px sans-serif";
  ctx.textAlign = "left";
  ctx.textBaseline = "middle";
  const max = M.hd ? M.hd.max : 1;
  for (const f of [1, 0.25, 0]) {
    // colour index = sqrt(w / max): the weight f * max sits at height sqrt(f)
    ctx.fillText(formatWeight(f * max), x + LEGEND_W + 4, MT + (1 - Math.sqrt(f)) * (h - 1));
  }
}

function drawLabels(ctx) {
  const font = Math.max(9, Math.min(13, M.z * 0.8));
  ctx.font = font + "px sans-serif";
  ctx.fillStyle = "#222";
  const step = Math.max(1, Math.ceil((font + 2) / M.z));
  const hi = M.hover || [-1, -1];
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  const i0 = Math.max(0, Math.floor(M.cy));
  const i1 = Math.min(LQ - 1, Math.ceil(M.cy + (M.height - MT) / M.z));
  for (let i = i0 - (i0 % step); i <= i1; i += step) {
    if (i < i0) continue;
    ctx.fillStyle = i === hi[0] ? "#e4572e" : "#222";
    ctx.fillText(clip(QT[i], 16), ML - 4, MT + (i - M.cy + 0.5) * M.z);
  }
  const j0 = Math.max(0, Math.floor(M.cx));
  const j1 = Math.min(LK - 1, Math.ceil(M.cx + (M.width - ML - MR) / M.z));
  ctx.textAlign = "left";
  for (let j = j0 - (j0 % step); j <= j1; j += step) {
    if (j < j0) continue;
    ctx.save();
    ctx.translate(ML + (j - M.cx + 0.5) * M.z, MT - 4);
    ctx.rotate(-Math.PI / 2);
    ctx.fillStyle = j === hi[1] ? "#e4572e" : "#222";
    ctx.fillText(clip(KT[j], 14), 0, 0);
    ctx.restore();
  }
}

function clip(text, n) {
  return text.length > n ? text.slice(0, n - 1) + "\u2026" : text;
}

function cellAt(x, y) {
  const j = Math.floor(M.cx + (x - ML) / M.z);
  const i = Math.floor(M.cy + (y - MT) / M.z);
  if (x < ML || y < MT || x > M.width - MR || i < 0 || j < 0 || i >= LQ || j >= LK) return null;
  return [i, j];
}

function localPoint(ev) {
  const r = M.canvas.getBoundingClientRect();
  return [ev.clientX - r.left, ev.clientY - r.top];
}

function hoverAt(x, y) {
  const cell = cellAt(x, y);
  M.hover = cell;
  if (!cell || !M.hd) {
    M.readout.textContent = M.idle;
    delete M.readout.dataset.weight;
  } else {
    const [i, j] = cell;
    const w = weightOf(M.hd, i, j);
    const err = errorOf(M.hd, i);
    M.readout.textContent = `query ${i} \u201c${QT[i]}\u201d \u2192 key ${j} \u201c${KT[j]}\u201d: `
      + `${formatWeight(w)}  (\u00b1${formatWeight(err)}, ${META.bits}-bit)`;
    M.readout.dataset.weight = String(w);
    M.readout.dataset.error = String(err);
    M.readout.dataset.q = String(i);
    M.readout.dataset.k = String(j);
  }
  requestDraw();
}

let drawPending = false;
function requestDraw() {
  if (drawPending) return;
  drawPending = true;
  requestAnimationFrame(() => {
    drawPending = false;
    drawMatrix();
  });
}

function zoomAt(x, y, factor) {
  const fit = Math.min((M.width - ML - MR) / LK, (M.height - MT) / LQ);
  const z = Math.min(Math.max(M.z * factor, fit * 0.5), 80);
  const dx = M.cx + (x - ML) / M.z;
  const dy = M.cy + (y - MT) / M.z;
  M.cx = dx - (x - ML) / z;
  M.cy = dy - (y - MT) / z;
  M.z = z;
  requestDraw();
}

M.canvas.addEventListener("wheel", (ev) => {
  ev.preventDefault();
  const [x, y] = localPoint(ev);
  zoomAt(x, y, Math.exp(-ev.deltaY * 0.0015));
}, { passive: false });
M.canvas.addEventListener("mousedown", (ev) => {
  M.drag = [ev.clientX, ev.clientY, M.cx, M.cy];
});
window.addEventListener("mouseup", () => { M.drag = null; });
M.canvas.addEventListener("mousemove", (ev) => {
  if (M.drag) {
    const [x0, y0, cx0, cy0] = M.drag;
    M.cx = cx0 - (ev.clientX - x0) / M.z;
    M.cy = cy0 - (ev.clientY - y0) / M.z;
    requestDraw();
    return;
  }
  const [x, y] = localPoint(ev);
  hoverAt(x, y);
});
M.canvas.addEventListener("mouseleave", () => hoverAt(-1, -1));
M.canvas.addEventListener("dblclick", (ev) => {
  const [x, y] = localPoint(ev);
  zoomAt(x, y, 2);
});
$("m-reset").addEventListener("click", () => { fitMatrix(); requestDraw(); });
$("m-zoom-in").addEventListener("click", () => zoomAt(M.width / 2, M.height / 2, 1.5));
$("m-zoom-out").addEventListener("click", () => zoomAt(M.width / 2, M.height / 2, 1 / 1.5));
$("m-save").addEventListener("click", () => {
  M.canvas.toBlob((blob) => {
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = `attention-layer${META.layers[STATE.layer]}-head${META.heads[STATE.head]}.png`;
    a.click();
    setTimeout(() => URL.revokeObjectURL(a.href), 1000);
  });
});

// client coordinates of the centre of cell (i, j) (for tests and scripting)
function matrixCellPoint(i, j) {
  const r = M.canvas.getBoundingClientRect();
  return { x: r.left + ML + (j - M.cx + 0.5) * M.z, y: r.top + MT + (i - M.cy + 0.5) * M.z };
}
