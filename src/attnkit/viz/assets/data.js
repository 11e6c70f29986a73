// attnkit view: data access. The weights arrive as one base64 blob of zlib streams, one per
// (layer, head): [row scale m_i: Lq x float32 LE][codes: Lq x Lk x uint8 (or uint16 LE)],
// weight(i, j) = m_i * code(i, j) / Q with Q = 2^bits - 1 (see attnkit.viz.html).
// Everything here is plain data: tokens and labels only ever reach the page as textContent.

performance.mark("attnkit-start");
const $ = (id) => document.getElementById(id);
const PAGE = JSON.parse($("attnkit-meta").textContent);
// A page holds one kind of attention, or several "sections" (e.g. an encoder-decoder's encoder,
// decoder and cross-attention) with their own tokens; "#section-N" in the URL picks one.
const SECTIONS = PAGE.sections || [PAGE];
const SECTION = (() => {
  const m = /^#section-(\d+)$/.exec(location.hash);
  const n = m ? Number(m[1]) : 0;
  return n < SECTIONS.length ? n : 0;
})();
const META = Object.assign({}, SECTIONS[SECTION], { title: PAGE.title, bits: PAGE.bits });
const [N, H, LQ, LK] = META.shape;
const Q = META.bits === 16 ? 65535 : 255;
const BLOB = decodeBase64($("attnkit-data").textContent);
performance.mark("attnkit-decoded");

function decodeBase64(text) {
  // both decoders skip ASCII whitespace themselves (forgiving base64)
  if (typeof Uint8Array.fromBase64 === "function") return Uint8Array.fromBase64(text.trim());
  const s = atob(text);
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}

async function inflate(bytes) {
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

const HEADS = new Map(); // l * H + h -> Promise of a decoded head (a few kept: LRU)
const KEEP = LQ * LK > 1e6 ? 6 : 72;

function loadHead(l, h) {
  const key = l * H + h;
  if (HEADS.has(key)) {
    const p = HEADS.get(key);
    HEADS.delete(key);
    HEADS.set(key, p);
    return p;
  }
  const [off, len] = META.blocks[key];
  const p = inflate(BLOB.subarray(off, off + len)).then((raw) => decodeHead(raw));
  HEADS.set(key, p);
  while (HEADS.size > KEEP) HEADS.delete(HEADS.keys().next().value);
  return p;
}

function decodeHead(raw) {
  const buf = raw.buffer;
  const scale = new Float32Array(buf, raw.byteOffset, LQ);
  const codes = META.bits === 16
    ? new Uint16Array(buf, raw.byteOffset + 4 * LQ, LQ * LK)
    : new Uint8Array(buf, raw.byteOffset + 4 * LQ, LQ * LK);
  let max = 0;
  for (let i = 0; i < LQ; i++) if (scale[i] > max) max = scale[i];
  return { scale, codes, max, topk: new Map() };
}

function weightOf(hd, i, j) {
  return (hd.scale[i] * hd.codes[i * LK + j]) / Q;
}

// The largest error of a stored weight of row i: half a quantisation step of that row.
function errorOf(hd, i) {
  return hd.scale[i] / (2 * Q);
}

function formatWeight(w) {
  if (w === 0) return "0";
  if (w >= 0.001) return w.toFixed(4);
  return w.toExponential(2);
}

// Indices of the k largest codes of row i, largest first (ties: smaller index first).
function topKeys(hd, i, k) {
  const codes = hd.codes;
  const base = i * LK;
  const idx = [];
  for (let j = 0; j < LK; j++) {
    const c = codes[base + j];
    if (c === 0) continue;
    if (idx.length === k && c <= codes[base + idx[k - 1]]) continue;
    let p = idx.length === k ? k - 1 : idx.length;
    while (p > 0 && codes[base + idx[p - 1]] < c) {
      idx[p] = idx[p - 1];
      p--;
    }
    idx[p] = j;
  }
  return idx;
}

function topPerQuery(hd, k) {
  if (!hd.topk.has(k)) {
    const rows = new Array(LQ);
    for (let i = 0; i < LQ; i++) rows[i] = topKeys(hd, i, k);
    hd.topk.set(k, rows);
  }
  return hd.topk.get(k);
}

// Viridis, 256 entries interpolated from 9 anchors; colour index = 255 * sqrt(w / max).
const LUT = (() => {
  const a = [
    [68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
    [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37],
  ];
  const lut = new Uint8ClampedArray(256 * 4);
  for (let i = 0; i < 256; i++) {
    const t = (i / 255) * (a.length - 1);
    const k = Math.min(Math.floor(t), a.length - 2);
    const f = t - k;
    for (let c = 0; c < 3; c++) lut[4 * i + c] = a[k][c] + f * (a[k + 1][c] - a[k][c]);
    lut[4 * i + 3] = 255;
  }
  return lut;
})();

function tokenText(tok) {
  // control characters (newlines, bidi overrides, U+2028) shown escaped, never interpreted
  return tok.replace(/[\u0000-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g,
    (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));
}

const QT = META.q_tokens.map(tokenText);
const KT = META.k_tokens.map(tokenText);
