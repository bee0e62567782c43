// Rendering of kernel output: ANSI text, MIME bundles, isolated HTML frames.
//
// Everything the kernel sends is untrusted. Text only ever reaches the DOM as
// textContent; HTML only inside <iframe sandbox srcdoc> frames that may not run
// scripts and have an opaque origin (no allow-scripts, no allow-same-origin),
// with their own Content-Security-Policy on top of the page's inherited one.

// ----------------------------------------------------------------- ANSI text

const ESCAPES = /\x1b\[([0-9;?]*)([A-Za-z])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][A-Za-z0-9]|\x1b[=>78]/g;

export function newAnsiState() {
  return { fg: null, bg: null, bold: false, dim: false, italic: false, underline: false, inverse: false };
}

function color256(n) {
  if (n < 16) return { index: n };
  if (n < 232) {
    const i = n - 16;
    const level = (v) => (v === 0 ? 0 : 55 + v * 40);
    return { rgb: [level(Math.floor(i / 36)), level(Math.floor(i / 6) % 6), level(i % 6)] };
  }
  const g = 8 + (n - 232) * 10;
  return { rgb: [g, g, g] };
}

function applySgr(state, params) {
  const codes = params === "" ? [0] : params.split(";").map((p) => (p === "" ? 0 : Number(p)));
  for (let i = 0; i < codes.length; i++) {
    const c = codes[i];
    if (c === 0) Object.assign(state, newAnsiState());
    else if (c === 1) state.bold = true;
    else if (c === 2) state.dim = true;
    else if (c === 3) state.italic = true;
    else if (c === 4) state.underline = true;
    else if (c === 7) state.inverse = true;
    else if (c === 22) { state.bold = false; state.dim = false; }
    else if (c === 23) state.italic = false;
    else if (c === 24) state.underline = false;
    else if (c === 27) state.inverse = false;
    else if (c >= 30 && c <= 37) state.fg = { index: c - 30 };
    else if (c >= 90 && c <= 97) state.fg = { index: c - 90 + 8 };
    else if (c === 39) state.fg = null;
    else if (c >= 40 && c <= 47) state.bg = { index: c - 40 };
    else if (c >= 100 && c <= 107) state.bg = { index: c - 100 + 8 };
    else if (c === 49) state.bg = null;
    else if (c === 38 || c === 48) {
      let color = null;
      if (codes[i + 1] === 5 && i + 2 < codes.length) {
        color = color256(codes[i + 2] & 255);
        i += 2;
      } else if (codes[i + 1] === 2 && i + 4 < codes.length) {
        color = { rgb: [codes[i + 2] & 255, codes[i + 3] & 255, codes[i + 4] & 255] };
        i += 4;
      } else {
        break;
      }
      if (c === 38) state.fg = color;
      else state.bg = color;
    }
  }
}

function styled(text, state) {
  const plain = !state.fg && !state.bg && !state.bold && !state.dim && !state.italic && !state.underline && !state.inverse;
  if (plain) return document.createTextNode(text);
  const span = document.createElement("span");
  span.textContent = text;
  let fg = state.fg;
  let bg = state.bg;
  if (state.inverse) {
    [fg, bg] = [bg || { index: 15 }, fg || { index: 0 }];
  }
  if (fg) {
    if (fg.index !== undefined) span.classList.add(`ansi-fg-${fg.index}`);
    else span.style.color = `rgb(${fg.rgb.join(",")})`;
  }
  if (bg) {
    if (bg.index !== undefined) span.classList.add(`ansi-bg-${bg.index}`);
    else span.style.backgroundColor = `rgb(${bg.rgb.join(",")})`;
  }
  if (state.bold) span.classList.add("ansi-bold");
  if (state.dim) span.classList.add("ansi-dim");
  if (state.italic) span.classList.add("ansi-italic");
  if (state.underline) span.classList.add("ansi-underline");
  return span;
}

/** Text with ANSI escape codes -> DOM nodes (colours as classes, never HTML).
 *  `state` carries the current style across calls and is updated in place. */
export function ansiNodes(text, state = newAnsiState()) {
  const frag = document.createDocumentFragment();
  let last = 0;
  ESCAPES.lastIndex = 0;
  let m;
  while ((m = ESCAPES.exec(text)) !== null) {
    if (m.index > last) frag.append(styled(text.slice(last, m.index), state));
    if (m[2] === "m") applySgr(state, m[1] || "");
    last = ESCAPES.lastIndex;
  }
  if (last < text.length) frag.append(styled(text.slice(last), state));
  return frag;
}

export function stripAnsi(text) {
  return text.replace(ESCAPES, "");
}

/** What a terminal shows for one line: `\r` returns to the line start, `\b` erases. */
function terminalLine(line) {
  if (line.includes("\r")) {
    // like Jupyter: what follows the last \r replaces the line (a trailing \r
    // keeps the line shown until the next text replaces it)
    const parts = line.split("\r").filter((part) => part !== "");
    line = parts.length ? parts[parts.length - 1] : "";
  }
  if (line.includes("\b")) {
    const out = [];
    for (const ch of line) {
      if (ch === "\b") out.pop();
      else out.push(ch);
    }
    line = out.join("");
  }
  return line;
}

// ---------------------------------------------------------------- streams

/** One stdout or stderr block; consecutive chunks of the same stream append to it.
 *  Complete lines are rendered once; only the last, unfinished line is redrawn,
 *  so a long-running cell's output costs linear time. */
export class StreamOutput {
  constructor(name) {
    this.name = name;
    this.el = document.createElement("pre");
    this.el.className = `output output-stream stream-${name}`;
    this.committed = document.createElement("span");
    this.tailEl = document.createElement("span");
    this.el.append(this.committed, this.tailEl);
    this.state = newAnsiState();
    this.tail = "";
    this.length = 0;
  }

  append(text) {
    this.length += text.length;
    let raw = (this.tail + text).replace(/\r\n/g, "\n");
    const cut = raw.lastIndexOf("\n");
    if (cut >= 0) {
      const done = raw.slice(0, cut + 1).split("\n");
      done.pop();
      const lines = done.map(terminalLine).join("\n") + "\n";
      this.committed.append(ansiNodes(lines, this.state));
      raw = raw.slice(cut + 1);
    }
    this.tail = raw;
    const probe = Object.assign({}, this.state);
    this.tailEl.replaceChildren(ansiNodes(terminalLine(raw), probe));
  }

  get text() {
    return this.el.textContent;
  }
}

// ------------------------------------------------------------- MIME bundles

const MIME_ORDER = [
  "text/html",
  "image/png",
  "image/jpeg",
  "image/gif",
  "image/webp",
  "image/svg+xml",
  "text/markdown",
  "text/latex",
  "application/json",
  "text/plain",
];

function asText(value) {
  if (Array.isArray(value)) return value.join("");
  if (typeof value === "string") return value;
  return JSON.stringify(value, null, 2);
}

function pre(text, className) {
  const el = document.createElement("pre");
  el.className = className;
  el.append(ansiNodes(text));
  return el;
}

function image(mime, value, meta) {
  const img = document.createElement("img");
  img.className = "output-image";
  img.alt = mime === "image/svg+xml" ? "SVG output" : "image output";
  if (mime === "image/svg+xml") {
    // an <img> never runs scripts inside the SVG
    img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(asText(value));
  } else {
    img.src = `data:${mime};base64,` + asText(value).replace(/\s+/g, "");
  }
  const m = (meta && meta[mime]) || {};
  if (Number.isFinite(m.width)) img.width = m.width;
  if (Number.isFinite(m.height)) img.height = m.height;
  return img;
}

// Structured data the Python kernel sends beside a figure's picture and a
// DataFrame's table (kernelgw/events.py CHART_MIME, DATA_MIME): shown as a one-line
// caption under the picture or table, never as raw JSON.
const CHART_MIME = "application/vnd.kernelgw.chart+json";
const DATA_MIME = "application/vnd.kernelgw.data+json";
const STRUCTURED = new Set([CHART_MIME, DATA_MIME]);

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

function chartWords(chart) {
  const type = String(chart.type || "unknown").replace(/_/g, " ");
  const title = chart.title ? ` \u201c${chart.title}\u201d` : "";
  const elements = Array.isArray(chart.elements) ? chart.elements : [];
  if (chart.type === "superchart") {
    const parts = elements.filter(isObject).map((c) => String(c.type || "unknown").replace(/_/g, " "));
    return `${plural(parts.length, "chart")}${title}: ${parts.join(", ")}`;
  }
  const count = {
    line: () => plural(elements.length, "series"),
    scatter: () => plural(elements.length, "series"),
    bar: () => plural(elements.length, "bar"),
    pie: () => plural(elements.length, "slice"),
    box_and_whisker: () => plural(elements.length, "box"),
  }[chart.type];
  const axes = [chart.x_label, chart.y_label].filter(Boolean).join(" / ");
  return [`${type} chart${title}`, count ? count() : "", axes].filter(Boolean).join(" \u00b7 ");
}

function dataWords(table) {
  const columns = Object.keys(table);
  const first = columns.length ? table[columns[0]] : [];
  const rows = Array.isArray(first) ? first.length : 0;
  const names = columns.length > 6 ? [...columns.slice(0, 6), "\u2026"] : columns;
  return `data: ${plural(rows, "row")} \u00d7 ${plural(columns.length, "column")} (${names.join(", ")})`;
}

/** A one-line caption for a bundle's chart or table data, or null. */
export function structuredCaption(data) {
  const words = [];
  if (isObject(data[CHART_MIME])) words.push(chartWords(data[CHART_MIME]));
  if (isObject(data[DATA_MIME])) words.push(dataWords(data[DATA_MIME]));
  if (!words.length) return null;
  const el = document.createElement("div");
  el.className = "output-caption";
  el.textContent = words.join("; ");
  return el;
}

/** The richest representation of a MIME bundle this page can show safely. */
export function renderBundle(data, metadata) {
  const mime = MIME_ORDER.find((m) => data[m] !== undefined && data[m] !== null);
  const wrap = document.createElement("div");
  wrap.className = "output output-rich";
  const caption = structuredCaption(data);
  if (!mime) {
    const types = Object.keys(data).filter((m) => !(caption && STRUCTURED.has(m)));
    if (types.length || !caption) {
      wrap.append(pre(`[output of type ${types.join(", ") || "nothing"}: not shown here]`, "output-note"));
    }
    if (caption) wrap.append(caption);
    return wrap;
  }
  wrap.dataset.mime = mime;
  if (mime === "text/html") wrap.append(htmlFrame(asText(data[mime])));
  else if (mime.startsWith("image/")) wrap.append(image(mime, data[mime], metadata));
  else if (mime === "application/json") wrap.append(pre(JSON.stringify(data[mime], null, 2), "output-text"));
  else wrap.append(pre(asText(data[mime]), "output-text"));
  if (caption) wrap.append(caption);
  return wrap;
}

// -------------------------------------------------------------- HTML frames

// The frame's own policy comes first in its <head>; policies only ever add
// restrictions, so nothing in the kernel's HTML can relax it. No scripts at
// all, images only inline (no requests to the gateway or anywhere else).
const FRAME_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; font-src data:";

const FRAME_CSS = `
.kgw-root { margin: 0; padding: 2px 1px 4px; font: 13px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color: #1f2328; background: #fff; overflow-wrap: break-word; }
.kgw-root table { border-collapse: collapse; border: none; font-size: 12px; }
.kgw-root thead { border-bottom: 1px solid #444; vertical-align: bottom; }
.kgw-root tr, .kgw-root th, .kgw-root td { text-align: right; vertical-align: middle; padding: 0.35em 0.6em;
  line-height: normal; white-space: normal; border: none; }
.kgw-root th { font-weight: 600; }
.kgw-root tbody tr:nth-child(odd) { background: #f6f8fa; }
.kgw-root tbody tr:hover { background: #e7f0fd; }
.kgw-root pre, .kgw-root code { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
.kgw-root img { max-width: 100%; }
`;

function frameDocument(html) {
  return (
    "<!doctype html><html><head><meta charset=\"utf-8\">" +
    `<meta http-equiv="Content-Security-Policy" content="${FRAME_CSP}">` +
    `<style>${FRAME_CSS} html, body { margin: 0; padding: 0; }</style>` +
    "</head><body class=\"kgw-root\">" +
    html +
    "</body></html>"
  );
}

const frames = new Set();

/** Kernel HTML in an isolated frame: sandboxed (no scripts, opaque origin), content via srcdoc. */
export function htmlFrame(html) {
  const iframe = document.createElement("iframe");
  iframe.className = "output-html";
  iframe.setAttribute("sandbox", ""); // no allow-scripts, no allow-same-origin, no forms, no popups
  iframe.setAttribute("referrerpolicy", "no-referrer");
  iframe.setAttribute("loading", "eager");
  iframe.title = "HTML output (isolated, scripts disabled)";
  iframe.srcdoc = frameDocument(html);
  iframe.style.height = "60px";
  frames.add({ iframe, html });
  scheduleFit();
  return iframe;
}

// The page cannot look into an opaque-origin frame to read its height, so it
// measures a sanitised, inert copy of the HTML (no scripts, no URLs, no event
// handlers, in a shadow root so no style leaks) at the frame's width.

const KEEP = new Set(
  ("table thead tbody tfoot tr th td caption colgroup col div span p b i em strong u s small big sub sup br hr " +
    "pre code kbd samp var tt h1 h2 h3 h4 h5 h6 ul ol li dl dt dd blockquote center font label details summary " +
    "figure figcaption section article header footer main nav aside mark abbr cite q del ins style img a").split(" ")
);
const KEEP_ATTRS = new Set(["class", "colspan", "rowspan", "align", "valign", "width", "height", "border",
  "cellpadding", "cellspacing", "style", "size", "face", "open", "start", "type", "dir"]);

function sanitise(node) {
  for (const child of Array.from(node.children)) {
    const tag = child.localName;
    if (!KEEP.has(tag)) {
      child.remove();
      continue;
    }
    for (const attr of Array.from(child.attributes)) {
      if (!KEEP_ATTRS.has(attr.name) || /url\s*\(|expression|@import/i.test(attr.value)) child.removeAttribute(attr.name);
    }
    if (tag === "style") {
      child.textContent = child.textContent.replace(/@import[^;]*;?/gi, "").replace(/url\s*\(/gi, "x(");
      continue;
    }
    sanitise(child);
  }
}

let measureHost = null;

function measure(html, width) {
  if (!measureHost) {
    measureHost = document.createElement("div");
    measureHost.setAttribute("aria-hidden", "true");
    measureHost.className = "frame-measure";
    measureHost.attachShadow({ mode: "open" });
    document.body.append(measureHost);
  }
  const doc = new DOMParser().parseFromString(html, "text/html"); // inert: nothing runs, nothing loads
  const root = document.createElement("div");
  root.className = "kgw-root";
  root.style.width = `${width}px`;
  root.style.boxSizing = "border-box"; // like the frame's body: padding inside the width
  for (const style of Array.from(doc.head ? doc.head.querySelectorAll("style") : [])) doc.body.prepend(style);
  sanitise(doc.body);
  root.append(...Array.from(doc.body.childNodes).map((n) => document.importNode(n, true)));
  const base = document.createElement("style");
  base.textContent = FRAME_CSS;
  measureHost.shadowRoot.replaceChildren(base, root);
  const height = root.getBoundingClientRect().height;
  const wide = root.scrollWidth > root.clientWidth + 1;
  measureHost.shadowRoot.replaceChildren();
  return Math.ceil(height) + (wide ? 18 : 0) + 4;
}

let fitQueued = false;

function scheduleFit() {
  if (fitQueued) return;
  fitQueued = true;
  requestAnimationFrame(() => {
    fitQueued = false;
    fitFrames(false);
  });
}

/** Size frames to their content (new ones, or all after the window changed width). */
export function fitFrames(all) {
  for (const entry of frames) {
    const { iframe, html } = entry;
    if (!iframe.isConnected) {
      if (entry.fitted) frames.delete(entry);
      continue;
    }
    const width = iframe.clientWidth;
    if (!width || (entry.fitted === width && !all)) continue;
    let height;
    try {
      height = measure(html, width);
    } catch (err) {
      height = 200;
    }
    iframe.style.height = `${Math.max(24, Math.min(height, 900))}px`;
    entry.fitted = width;
  }
}

let resizeTimer = null;
window.addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => fitFrames(true), 150);
});

export function formatBytes(n) {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = n;
  let i = -1;
  do {
    v /= 1024;
    i++;
  } while (v >= 1024 && i < units.length - 1);
  return `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}
