// kernelgw web page: sessions, cells and their live output over the WebSocket.
//
// Protocol (docs/reference/events.md): the page connects to /v1/sessions/{id}/ws with
// ?last_seq=N (0 on first open, so the replay buffer shows the session's earlier
// cells), sends {"type": "execute", ...} and {"type": "interrupt"}, and renders
// every event by its execution_id. Cells run by other tabs or clients arrive as
// `queued` events. After a drop it reconnects with the last seq it saw; a `gap`
// (events older than the replay buffer) is filled from the stored history.
// With API keys, every request carries the key and every connect a fresh token
// (see "the API key" below); close codes 4401/4403/4404 are shown, not retried
// forever.

import { StreamOutput, ansiNodes, fitFrames, formatBytes, renderBundle } from "./render.js";

const $ = (id) => document.getElementById(id);

// ------------------------------------------------------------------ helpers

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function randomId(prefix) {
  const bytes = new Uint8Array(8);
  crypto.getRandomValues(bytes);
  return prefix + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function encodePath(path) {
  return path.split("/").map(encodeURIComponent).join("/");
}

function sessionUrl(id, suffix = "") {
  return `/v1/sessions/${encodeURIComponent(id)}${suffix}`;
}

// ------------------------------------------------------------- the API key
//
// A gateway with API keys wants "Authorization: Bearer <key>" on every /v1
// request. The page asks for the key when the gateway says so (401) and keeps it
// in sessionStorage only: this tab, until it closes or the user forgets it. It is
// never put in localStorage, a URL or the console. WebSockets cannot carry
// headers, so before each connect the page trades the key for a short-lived
// token (POST /v1/auth/token) and puts that on the WebSocket URL instead.

const KEY_STORAGE = "kernelgw.apiKey";

const auth = {
  required: false, // the gateway wants keys (whoami said so, or a 401 did)
  locked: false, // waiting for the user to give a key: no requests meanwhile
  key: null,
  onRejected: null, // (message, keySent) => void, set by the App

  load() {
    try {
      this.key = sessionStorage.getItem(KEY_STORAGE) || null;
    } catch {
      this.key = null; // storage disabled: the key lasts as long as the page
    }
  },

  save(key) {
    this.key = key;
    try {
      sessionStorage.setItem(KEY_STORAGE, key);
    } catch {
      // kept in memory only
    }
  },

  clear() {
    this.key = null;
    try {
      sessionStorage.removeItem(KEY_STORAGE);
    } catch {
      // nothing stored
    }
  },
};

class HttpError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

// A fetch with the key; the response if it is 2xx, else an HttpError with the
// gateway's message. `key` checks a key the user typed instead of the stored one.
async function request(method, url, { body, headers = {}, key } = {}) {
  const checking = key !== undefined;
  if (auth.locked && !checking) throw new HttpError("An API key is needed.", 401);
  const used = checking ? key : auth.key;
  const init = { method, headers: { ...headers } };
  if (used) init.headers.authorization = `Bearer ${used}`;
  if (body !== undefined) {
    if (body instanceof Blob) init.body = body;
    else {
      init.body = JSON.stringify(body);
      init.headers["content-type"] = "application/json";
    }
  }
  const resp = await fetch(url, init);
  if (resp.ok) return resp;
  const type = resp.headers.get("content-type") || "";
  const data = type.includes("json") ? await resp.json().catch(() => null) : null;
  const message = (data && data.error && data.error.message) || `${method} ${url}: HTTP ${resp.status}`;
  // the key in use was refused (not an older one a slow request carried)
  if (resp.status === 401 && !checking && auth.key === used && auth.onRejected) auth.onRejected(message, Boolean(used));
  throw new HttpError(message, resp.status);
}

async function api(method, url, body, headers = {}) {
  const resp = await request(method, url, { body, headers });
  const type = resp.headers.get("content-type") || "";
  return type.includes("json") ? resp.json().catch(() => null) : null;
}

function toast(message, kind = "info", ms = 5000) {
  const node = el("div", `toast toast-${kind}`, message);
  $("toasts").append(node);
  setTimeout(() => node.remove(), ms);
  return node;
}

function banner(message, kind = "warn") {
  const node = $("banner");
  if (!message) {
    node.hidden = true;
    return;
  }
  node.className = `banner banner-${kind}`;
  node.textContent = message;
  node.hidden = false;
}

function relativeTime(iso) {
  const t = Date.parse(iso);
  if (!Number.isFinite(t)) return "";
  const s = Math.max(0, Math.round((Date.now() - t) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}

function formatDuration(ms) {
  if (ms == null) return "";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
}

// -------------------------------------------------------------------- cells

const STATUS_TEXT = {
  sending: "sending",
  queued: "queued",
  running: "running",
  ok: "ok",
  error: "error",
  timeout: "timeout",
  interrupted: "interrupted",
  dead: "kernel died",
  refused: "not run",
  unknown: "earlier",
};

class Cell {
  constructor(app, executionId, code) {
    this.app = app;
    this.id = executionId;
    this.status = null;
    this.outputs = []; // {el, stream?, displayId?}
    this.lastStream = null;
    this.clearPending = false;
    this.done = false;

    this.el = el("article", "cell");
    this.el.dataset.executionId = executionId;
    this.prompt = el("div", "prompt", "In [ ]:");
    const body = el("div", "cell-body");
    const head = el("div", "cell-head");
    this.badge = el("span", "badge");
    this.meta = el("span", "cell-meta muted small");
    const edit = el("button", "link-button small", "edit");
    edit.type = "button";
    edit.title = "Copy this code into the editor";
    edit.addEventListener("click", () => app.editCode(this.code));
    head.append(this.badge, this.meta, edit);
    this.input = el("pre", "cell-input");
    this.outputEl = el("div", "cell-outputs");
    this.foot = el("div", "cell-foot");
    body.append(head, this.input, this.outputEl, this.foot);
    this.el.append(this.prompt, body);
    this.setCode(code);
    this.setStatus("sending");
  }

  setCode(code) {
    this.code = code;
    this.input.textContent = code == null ? "(code not available)" : code;
    this.input.classList.toggle("muted", code == null);
  }

  setStatus(status, extra = "") {
    this.status = status;
    this.badge.className = `badge status-${status}`;
    this.badge.textContent = (STATUS_TEXT[status] || status) + (extra ? ` ${extra}` : "");
    this.el.dataset.status = status;
    this.app.updateRunning();
  }

  get running() {
    return !this.done && (this.status === "running" || this.status === "queued" || this.status === "sending");
  }

  addOutput(node, extra = {}) {
    if (this.clearPending) this.clear();
    this.outputEl.append(node);
    const out = { el: node, ...extra };
    this.outputs.push(out);
    return out;
  }

  clear() {
    this.clearPending = false;
    for (const out of this.outputs) {
      if (out.displayId) this.app.forgetDisplay(out.displayId, out);
    }
    this.outputs = [];
    this.lastStream = null;
    this.outputEl.replaceChildren();
  }

  handle(event) {
    switch (event.type) {
      case "queued":
        if (event.code !== undefined) this.setCode(event.code);
        if (!this.done && this.status !== "running") this.setStatus("queued", event.position ? `(${event.position} ahead)` : "");
        break;
      case "status":
        if (event.state === "busy" && !this.done) this.setStatus("running");
        break;
      case "stream": {
        if (this.clearPending) this.clear();
        if (!this.lastStream || this.lastStream.stream.name !== event.name) {
          const stream = new StreamOutput(event.name);
          this.lastStream = this.addOutput(stream.el, { stream });
        }
        this.lastStream.stream.append(event.text);
        break;
      }
      case "display":
      case "result": {
        const node = renderBundle(event.data || {}, event.metadata || {});
        if (event.type === "result") {
          node.classList.add("output-result");
          if (event.execution_count != null) node.dataset.prompt = `Out[${event.execution_count}]`;
        }
        const out = this.addOutput(node, { displayId: event.display_id || null });
        this.lastStream = null;
        if (event.display_id) this.app.rememberDisplay(event.display_id, out);
        break;
      }
      case "update_display":
        this.app.updateDisplay(event);
        break;
      case "clear_output":
        if (event.wait) this.clearPending = true;
        else this.clear();
        break;
      case "error": {
        const box = el("div", "output output-error");
        const title = el("div", "error-title");
        title.append(el("strong", "", event.ename), document.createTextNode(event.evalue ? `: ${event.evalue}` : ""));
        box.append(title);
        const lines = event.traceback && event.traceback.length ? event.traceback : event.traceback_text || [];
        if (lines.length) {
          const tb = el("pre", "traceback");
          tb.append(ansiNodes(lines.join("\n")));
          box.append(tb);
        }
        this.addOutput(box);
        this.lastStream = null;
        break;
      }
      case "truncated": {
        const note = el("div", "output output-note warn", `⚠ ${event.message || "Output truncated"}`);
        note.title = `limit: ${formatBytes(event.limit_bytes || 0)}`;
        this.outputEl.append(note);
        this.lastStream = null;
        break;
      }
      case "late": {
        // output the kernel sent after this cell's done (a forged end): shown, marked
        if (!event.event) break;
        if (!this.lateNoted) {
          this.lateNoted = true;
          this.outputEl.append(el("div", "output output-note warn output-late", "⚠ sent after this execution had ended"));
          this.lastStream = null;
        }
        this.handle(event.event);
        if (event.event.type === "error") this.setStatus("error");
        break;
      }
      case "done":
        this.finish(event);
        break;
      case "protocol_error":
        this.done = true;
        this.setStatus("refused");
        this.foot.append(el("div", "reason error-text", event.message));
        break;
      default:
        break;
    }
  }

  finish(event) {
    this.done = true;
    this.clearPending = false;
    if (event.execution_count != null) this.prompt.textContent = `In [${event.execution_count}]:`;
    this.setStatus(event.status);
    this.meta.textContent = formatDuration(event.duration_ms);
    this.foot.replaceChildren();
    // an error's reason repeats the error shown above it
    const shown = event.status === "error" && this.outputs.some((o) => o.el.classList.contains("output-error"));
    if (event.reason && !shown) this.foot.append(el("div", `reason reason-${event.status}`, event.reason));
    if (event.state_lost) {
      this.foot.append(el("div", "reason reason-lost", "The kernel was restarted: variables from earlier cells are gone."));
    }
    const artifacts = event.artifacts || [];
    if (artifacts.length) {
      const box = el("div", "artifacts");
      box.append(el("span", "muted small", artifacts.length === 1 ? "File: " : "Files: "));
      for (const a of artifacts) box.append(this.app.fileLink(a.path, a.size, a.change));
      this.foot.append(box);
    }
  }
}

// ---------------------------------------------------------------- the page

class App {
  constructor() {
    this.sessionId = null;
    this.ws = null;
    this.lastSeq = 0;
    this.cells = new Map();
    this.displays = new Map();
    this.outbox = [];
    this.filling = false;
    this.buffered = [];
    this.reconnectDelay = 250;
    this.reconnectTimer = null;
    this.ended = false;
    this.infoTimer = null;
    this.filesTimer = null;
    this.connectAttempt = 0; // a newer connect() makes an older one's token fetch moot
    this.tokenRetried = false; // a 4401 gets one retry with a fresh token
    this.begun = false;
  }

  // ---- start-up and navigation

  async start() {
    this.bindGlobal();
    auth.load();
    auth.onRejected = (message, keySent) => this.needKey(keySent ? `The gateway refused the key: ${message}` : null);
    let who = null;
    try {
      who = await api("GET", "/v1/auth/whoami");
    } catch (err) {
      if (err.status === 401) return; // the key form is up; begin() once a key is accepted
      // a gateway without whoami (404) or a network error: go on as without keys
    }
    this.signedIn(who);
    this.begin();
  }

  begin() {
    this.begun = true;
    const id = new URLSearchParams(location.search).get("session");
    if (id) this.openSession(id);
    else this.showHome();
  }

  // ---- the API key

  signedIn(who) {
    auth.required = Boolean(who && who.auth);
    const meta = $("auth-meta");
    meta.hidden = !auth.required || !auth.key;
    if (!meta.hidden) {
      $("auth-name").textContent = who.name || who.key_id || "";
      $("auth-name").title = `key id ${who.key_id}${who.role ? `, role ${who.role}` : ""}`;
    }
  }

  // The gateway refused the key (or wants one): stop talking to it and ask.
  needKey(message) {
    auth.required = true;
    auth.clear();
    $("auth-meta").hidden = true;
    if (!auth.locked) {
      auth.locked = true;
      clearTimeout(this.reconnectTimer);
      this.connectAttempt++;
      if (this.ws) {
        const ws = this.ws;
        this.ws = null;
        ws.close();
      }
      if (this.sessionId && !this.ended) this.setConn("closed");
    }
    const error = $("auth-error");
    error.textContent = message || "";
    error.hidden = !message;
    $("auth-overlay").hidden = false;
    $("api-key").focus();
  }

  async submitKey() {
    const input = $("api-key");
    const key = input.value.trim();
    const error = $("auth-error");
    const showError = (text) => {
      error.textContent = text;
      error.hidden = false;
      input.focus();
      input.select();
    };
    if (!key) return showError("Paste the key first.");
    if (/[^\x21-\x7e]/.test(key)) return showError("A key has no spaces or special characters: it looks like kgw_…_… .");
    const button = $("auth-submit");
    button.disabled = true;
    button.textContent = "Checking…";
    let who;
    try {
      who = await request("GET", "/v1/auth/whoami", { key }).then((r) => r.json());
    } catch (err) {
      showError(err.status === 401 ? `The gateway refused this key: ${err.message}` : `Could not check the key: ${err.message}`);
      return;
    } finally {
      button.disabled = false;
      button.textContent = "Use key";
    }
    input.value = "";
    error.hidden = true;
    $("auth-overlay").hidden = true;
    auth.locked = false;
    if (who.auth) auth.save(key); // a gateway without keys needs none
    this.signedIn(who);
    this.resume();
  }

  // Carry on where the key form stopped the page.
  resume() {
    if (!this.begun) this.begin();
    else if (this.sessionId && !this.ended) {
      if (!this.ws) this.connect();
      this.refreshInfo();
      this.refreshFiles();
    } else if (this.sessionId) {
      if (this.cells.size === 0) this.showStoredCells();
    } else this.showHome();
  }

  forgetKey() {
    auth.clear();
    // start afresh: nothing the key showed stays on the page
    location.reload();
  }

  bindGlobal() {
    $("auth-form").addEventListener("submit", (e) => {
      e.preventDefault();
      this.submitKey();
    });
    $("forget-key").addEventListener("click", () => this.forgetKey());
    // downloads are links; with a key they are fetched with the header instead
    document.addEventListener("click", (e) => {
      const link = e.target instanceof Element && e.target.closest("a[download]");
      if (!link || !auth.key || e.defaultPrevented || e.button !== 0) return;
      const target = new URL(link.href, location.href);
      if (target.origin !== location.origin || !target.pathname.startsWith("/v1/")) return; // e.g. the blob: below
      e.preventDefault();
      this.download(link);
    });
    $("new-session").addEventListener("click", () => this.createSession());
    $("open-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const id = $("open-id").value.trim();
      if (id) location.search = `?session=${encodeURIComponent(id)}`;
    });
    $("run").addEventListener("click", () => this.runComposer());
    $("interrupt").addEventListener("click", () => this.interrupt());
    $("restart").addEventListener("click", () => this.restart());
    $("upload").addEventListener("click", () => $("upload-input").click());
    $("upload-input").addEventListener("change", (e) => {
      const files = Array.from(e.target.files || []);
      e.target.value = "";
      this.upload(files);
    });
    $("toggle-files").addEventListener("click", () => {
      const pane = $("files-pane");
      pane.hidden = !pane.hidden;
      $("workbench").classList.toggle("no-files", pane.hidden);
      fitFrames(true);
    });
    $("refresh-files").addEventListener("click", () => this.refreshFiles());
    $("copy-link").addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(location.href);
        toast("Link copied: open it in another tab or browser to watch this session live.");
      } catch {
        toast(location.href);
      }
    });
    const code = $("code");
    code.addEventListener("keydown", (e) => this.composerKey(e));
    code.addEventListener("input", () => this.growComposer());
    this.bindDrop();
    window.addEventListener("popstate", () => location.reload());
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden && this.sessionId) this.refreshInfo();
    });
  }

  async showHome() {
    document.title = "kernelgw";
    $("home").hidden = false;
    $("home-error").hidden = true;
    const body = $("sessions").tBodies[0];
    try {
      const { sessions } = await api("GET", "/v1/sessions");
      body.replaceChildren();
      for (const s of sessions) {
        const tr = el("tr");
        const link = el("a", "", s.id);
        link.href = `/?session=${encodeURIComponent(s.id)}`;
        const idCell = el("td");
        idCell.append(link);
        const stateCell = el("td");
        stateCell.append(el("span", `badge state-${s.state}`, s.state));
        const open = el("a", "btn small", "Open");
        open.href = link.href;
        const openCell = el("td");
        openCell.append(open);
        tr.append(idCell, stateCell, el("td", "", String(s.execution_count)), el("td", "", String(s.subscribers)),
          el("td", "muted", relativeTime(s.last_activity)), openCell);
        body.append(tr);
      }
      $("no-sessions").hidden = sessions.length > 0;
      $("sessions").hidden = sessions.length === 0;
    } catch (err) {
      $("home-error").textContent = `Could not list sessions: ${err.message}`;
      $("home-error").hidden = false;
    }
  }

  async createSession() {
    const button = $("new-session");
    button.disabled = true;
    button.textContent = "Starting…";
    try {
      const info = await api("POST", "/v1/sessions", {});
      history.pushState(null, "", `/?session=${encodeURIComponent(info.id)}`);
      $("home").hidden = true;
      this.openSession(info.id, info);
    } catch (err) {
      $("home-error").textContent = `Could not start a session: ${err.message}`;
      $("home-error").hidden = false;
    } finally {
      button.disabled = false;
      button.textContent = "New session";
    }
  }

  openSession(id, info) {
    this.sessionId = id;
    document.title = `kernelgw · ${id}`;
    $("home").hidden = true;
    $("workbench").hidden = false;
    $("session-meta").hidden = false;
    $("session-actions").hidden = false;
    $("session-id").textContent = id;
    $("notebook").href = sessionUrl(id, "/notebook");
    $("notebook").setAttribute("download", `kernelgw-${id}.ipynb`);
    if (info) this.showInfo(info);
    this.connect();
    this.refreshInfo();
    this.refreshFiles();
    this.infoTimer = setInterval(() => {
      if (!document.hidden) this.refreshInfo();
    }, 4000);
    $("code").focus();
  }

  // ---- session info

  async refreshInfo() {
    if (!this.sessionId || this.ended) return;
    try {
      this.showInfo(await api("GET", sessionUrl(this.sessionId)));
    } catch (err) {
      if (err.status === 404) this.sessionEnded();
    }
  }

  showInfo(info) {
    const state = $("session-state");
    state.className = `badge state-${info.state}`;
    state.textContent = info.state === "dead" ? "kernel dead" : info.state;
    state.title = info.dead_reason || "Session state";
    const n = info.subscribers;
    $("watchers").textContent = n > 1 ? `${n} watching` : "";
    if (info.state === "dead") banner(`The kernel is dead: ${info.dead_reason || "unknown reason"}. Restart it to go on.`, "error");
    else if (!this.ended && $("banner").classList.contains("banner-error")) banner(null);
  }

  showKernelBusy(busy) {
    const state = $("session-state");
    if (this.ended || state.classList.contains("state-dead")) return;
    state.className = `badge state-${busy ? "busy" : "idle"}`;
    state.textContent = busy ? "busy" : "idle";
  }

  sessionEnded() {
    if (this.ended) return;
    this.ended = true;
    clearInterval(this.infoTimer);
    clearTimeout(this.reconnectTimer);
    if (this.ws) {
      const ws = this.ws;
      this.ws = null;
      ws.close();
    }
    const state = $("session-state");
    state.className = "badge state-closed";
    state.textContent = "ended";
    this.setConn("closed");
    $("code").disabled = true;
    $("run").disabled = true;
    document.body.classList.add("ended");
    for (const id of ["interrupt", "restart", "upload"]) $(id).disabled = true;
    $("file-list").replaceChildren();
    $("files-empty").textContent = "The session has ended: its workspace is gone.";
    $("files-empty").hidden = false;
    const fromHistory = this.cells.size === 0;
    banner(`This session has ended${fromHistory ? "; its cells below come from the stored history" : ""}. ` +
      "The notebook can still be downloaded.", "info");
    for (const cell of this.cells.values()) {
      if (cell.running) {
        cell.done = true;
        cell.setStatus("dead");
      }
    }
    if (fromHistory) this.showStoredCells();
  }

  showStoredCells() {
    this.loadHistory().catch((err) => {
      if (err.status === 401) return; // the key form is up; resume() comes back here
      let text = `This session has ended; its history is unavailable: ${err.message}`;
      if (err.status === 404) {
        text = auth.required
          ? `There is no session ${this.sessionId} that this API key can see: it does not exist, or another key started it.`
          : `There is no session ${this.sessionId}, running or stored.`;
      }
      banner(text, "error");
    });
  }

  async loadHistory(first = 1, last = Infinity) {
    const data = await api("GET", sessionUrl(this.sessionId, "/history"));
    for (const execution of data.executions) {
      const events = execution.events.filter((e) => e.seq == null || (e.seq >= first && e.seq <= last));
      if (!events.length) continue;
      let cell = this.cells.get(execution.execution_id);
      if (!cell) cell = this.newCell(execution.execution_id, execution.code);
      for (const event of events) cell.handle(event);
    }
  }

  // ---- the WebSocket

  setConn(state) {
    const node = $("conn-state");
    node.className = `badge conn conn-${state}`;
    node.textContent = { open: "live", connecting: "connecting", reconnecting: "reconnecting", closed: "offline" }[state];
  }

  async connect() {
    if (this.ended || auth.locked) return;
    clearTimeout(this.reconnectTimer);
    const attempt = ++this.connectAttempt;
    this.setConn(this.lastSeq ? "reconnecting" : "connecting");
    let token = null;
    if (auth.required) {
      // a fresh token for every connect: they live only minutes
      try {
        ({ token } = await api("POST", "/v1/auth/token"));
      } catch (err) {
        if (attempt !== this.connectAttempt || err.status === 401) return; // 401: the key form is up
        this.retryLater();
        return;
      }
      if (attempt !== this.connectAttempt || this.ended || auth.locked) return;
    }
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const query = (token ? `token=${encodeURIComponent(token)}&` : "") + `last_seq=${this.lastSeq}`;
    const ws = new WebSocket(`${proto}//${location.host}${sessionUrl(this.sessionId, "/ws")}?${query}`);
    // The gateway accepts a WebSocket before it checks the token, then closes a
    // refused one (4401) unread: what went out before its first event is kept
    // so that it can be sent again on the next connection.
    ws.unconfirmed = [];
    this.ws = ws;
    ws.addEventListener("open", () => {
      if (this.ws !== ws) return;
      this.setConn("open");
      this.reconnectDelay = 250;
      const pending = this.outbox.splice(0);
      for (const msg of pending) this.sendOn(ws, msg);
      this.refreshInfo();
    });
    ws.addEventListener("message", (msg) => {
      if (this.ws !== ws) return;
      ws.unconfirmed = null; // the gateway took this connection
      let event;
      try {
        event = JSON.parse(msg.data);
      } catch {
        return;
      }
      this.onEvent(event);
    });
    ws.addEventListener("close", (e) => {
      if (this.ws !== ws) return;
      this.ws = null;
      if (e.code === 4404) {
        // no such session, or (with keys) another key's
        this.sessionEnded();
        return;
      }
      if (e.code === 4403) {
        this.setConn("closed");
        banner(`The gateway does not accept live connections from this page's origin (${location.origin}): ` +
          `${e.reason || "origin not allowed"}. Open the page at the gateway's own address, ` +
          "or add this origin to the gateway's allowed_origins.", "error");
        return;
      }
      if (e.code === 4401) {
        // the token was refused: expired on the way, or the key was revoked
        auth.required = true;
        if (ws.unconfirmed) this.outbox.unshift(...ws.unconfirmed);
        if (!this.tokenRetried) {
          this.tokenRetried = true;
          this.connect();
        } else {
          this.tokenRetried = false;
          this.needKey(`The gateway refused the live connection: ${e.reason || "the key or token is not valid"}`);
        }
        return;
      }
      this.tokenRetried = false;
      if (e.code === 1001) this.refreshInfo(); // deleted? then 404 ends it
      this.retryLater();
    });
  }

  retryLater() {
    this.setConn("reconnecting");
    clearTimeout(this.reconnectTimer);
    this.reconnectTimer = setTimeout(() => this.connect(), this.reconnectDelay);
    this.reconnectDelay = Math.min(this.reconnectDelay * 2, 5000);
  }

  send(msg) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.sendOn(this.ws, msg);
    else this.outbox.push(msg);
  }

  sendOn(ws, msg) {
    ws.send(JSON.stringify(msg));
    if (ws.unconfirmed) ws.unconfirmed.push(msg);
  }

  onEvent(event) {
    if (this.filling) {
      this.buffered.push(event);
      return;
    }
    if (event.type === "gap") {
      if (event.last_missing > this.lastSeq) {
        this.fillGap({ first_missing: Math.max(event.first_missing, this.lastSeq + 1), last_missing: event.last_missing });
      }
      return;
    }
    if (event.seq != null) {
      if (event.seq <= this.lastSeq) return; // already shown (a resume overlaps)
      this.lastSeq = event.seq;
    }
    this.apply(event);
  }

  apply(event) {
    if (event.type === "protocol_error") {
      // Without an execution_id the gateway could not read the message (too
      // large, say); it answers in order, so it is our oldest one not yet queued.
      let cell = event.execution_id && this.cells.get(event.execution_id);
      if (!event.execution_id) cell = Array.from(this.cells.values()).find((c) => c.status === "sending");
      if (cell && !cell.done) cell.handle(event);
      else toast(event.message, "error", 8000);
      return;
    }
    if (event.type === "update_display") {
      this.updateDisplay(event);
      return;
    }
    if (event.type === "status") this.showKernelBusy(event.state === "busy");
    if (!event.execution_id) return;
    let cell = this.cells.get(event.execution_id);
    const follow = this.nearBottom();
    if (!cell) cell = this.newCell(event.execution_id, event.type === "queued" ? event.code : null);
    else if (event.type === "queued" && cell.el !== $("cells").lastElementChild) {
      $("cells").append(cell.el); // cells run in the order they were queued
    }
    cell.handle(event);
    if (event.type === "done") this.afterDone(event);
    if (follow) this.scrollToBottom();
  }

  async fillGap(gap) {
    // Events first_missing..last_missing are older than the replay buffer: take
    // them from the stored history, and hold the live ones until that is done.
    this.filling = true;
    try {
      await this.loadHistory(gap.first_missing, gap.last_missing);
    } catch (err) {
      const note = el("div", "gap-note muted small",
        `Events ${gap.first_missing}–${gap.last_missing} of this session are no longer available (${err.message}).`);
      $("cells").append(note);
    }
    this.lastSeq = Math.max(this.lastSeq, gap.last_missing);
    this.filling = false;
    const held = this.buffered.splice(0);
    for (const event of held) this.onEvent(event);
    this.scrollToBottom();
  }

  newCell(executionId, code) {
    const cell = new Cell(this, executionId, code);
    if (code == null) cell.setStatus("unknown");
    this.cells.set(executionId, cell);
    $("cells").append(cell.el);
    return cell;
  }

  afterDone() {
    this.refreshInfo();
    clearTimeout(this.filesTimer);
    this.filesTimer = setTimeout(() => this.refreshFiles(), 200);
  }

  // ---- display ids

  rememberDisplay(id, out) {
    if (!this.displays.has(id)) this.displays.set(id, new Set());
    this.displays.get(id).add(out);
  }

  forgetDisplay(id, out) {
    const set = this.displays.get(id);
    if (set) set.delete(out);
  }

  updateDisplay(event) {
    const set = this.displays.get(event.display_id);
    if (!set) return;
    for (const out of set) {
      const node = renderBundle(event.data || {}, event.metadata || {});
      node.classList.add(...Array.from(out.el.classList).filter((c) => c === "output-result"));
      out.el.replaceWith(node);
      out.el = node;
    }
  }

  // ---- running code

  composerKey(e) {
    const ta = e.target;
    if (e.key === "Enter" && (e.shiftKey || e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      this.runComposer();
    } else if (e.key === "Tab" && !e.shiftKey) {
      e.preventDefault();
      ta.setRangeText("    ", ta.selectionStart, ta.selectionEnd, "end");
      this.growComposer();
    } else if (e.key === "Enter" && !e.altKey) {
      // keep the indentation, one level more after a colon
      const before = ta.value.slice(0, ta.selectionStart);
      const line = before.slice(before.lastIndexOf("\n") + 1);
      let indent = line.match(/^\s*/)[0];
      if (/:\s*$/.test(line)) indent += "    ";
      if (indent) {
        e.preventDefault();
        ta.setRangeText("\n" + indent, ta.selectionStart, ta.selectionEnd, "end");
        this.growComposer();
      }
    }
  }

  growComposer() {
    const ta = $("code");
    ta.style.height = "auto";
    ta.style.height = `${Math.min(ta.scrollHeight + 2, window.innerHeight * 0.5)}px`;
  }

  editCode(code) {
    if (code == null || this.ended) return;
    const ta = $("code");
    ta.value = code;
    this.growComposer();
    ta.focus();
    ta.setSelectionRange(code.length, code.length);
  }

  runComposer() {
    const ta = $("code");
    const code = ta.value;
    if (!code.trim() || this.ended) return;
    const id = randomId("web-");
    const cell = this.newCell(id, code);
    cell.setStatus("sending");
    this.send({ type: "execute", code, execution_id: id });
    ta.value = "";
    this.growComposer();
    this.scrollToBottom();
  }

  anyRunning() {
    for (const cell of this.cells.values()) if (cell.running) return true;
    return false;
  }

  updateRunning() {
    $("interrupt").disabled = this.ended || !this.anyRunning();
  }

  async interrupt() {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.send({ type: "interrupt" });
    else {
      try {
        await api("POST", sessionUrl(this.sessionId, "/interrupt"));
      } catch (err) {
        toast(`Interrupt failed: ${err.message}`, "error");
      }
    }
    toast("Interrupt sent.");
  }

  async restart() {
    if (!confirm("Restart the kernel? All variables are lost (files in the workspace too).")) return;
    const button = $("restart");
    button.disabled = true;
    try {
      this.showInfo(await api("POST", sessionUrl(this.sessionId, "/restart")));
      $("cells").append(el("div", "divider", "kernel restarted"));
      toast("The kernel was restarted.");
      this.refreshFiles();
    } catch (err) {
      toast(`Restart failed: ${err.message}`, "error");
    } finally {
      button.disabled = this.ended;
    }
  }

  nearBottom() {
    const doc = document.scrollingElement;
    return doc.scrollHeight - doc.scrollTop - window.innerHeight < 120;
  }

  scrollToBottom() {
    requestAnimationFrame(() => {
      document.scrollingElement.scrollTop = document.scrollingElement.scrollHeight;
    });
  }

  // ---- files

  fileLink(path, size, change) {
    const a = el("a", "file-link");
    a.href = sessionUrl(this.sessionId, `/files/${encodePath(path)}`);
    a.setAttribute("download", path.split("/").pop());
    a.textContent = `⬇ ${path}`;
    a.title = `${change ? change + ", " : ""}${formatBytes(size)}: download`;
    return a;
  }

  async refreshFiles() {
    if (!this.sessionId || this.ended) return;
    const list = $("file-list");
    try {
      const data = await api("GET", sessionUrl(this.sessionId, "/files?recursive=true"));
      const files = data.entries.filter((e) => e.type === "file").sort((a, b) => a.path.localeCompare(b.path));
      list.replaceChildren();
      for (const f of files) {
        const li = el("li");
        li.append(this.fileLink(f.path, f.size), el("span", "muted small", formatBytes(f.size)));
        list.append(li);
      }
      $("files-empty").hidden = files.length > 0;
    } catch (err) {
      if (this.ended || err.status === 409 || err.status === 401) return; // gone, (re)starting, or the key form is up
      $("files-empty").hidden = false;
      $("files-empty").textContent = `Files unavailable: ${err.message}`;
    }
  }

  async upload(files) {
    if (!files.length || this.ended || !this.sessionId) return;
    for (const file of files) {
      const progress = toast(`Uploading ${file.name} (${formatBytes(file.size)})…`, "info", 600000);
      try {
        await api("PUT", sessionUrl(this.sessionId, `/files/${encodePath(file.name)}`), file, {
          "content-type": "application/octet-stream",
        });
        toast(`Uploaded ${file.name}: open it in a cell as '${file.name}'.`, "ok");
      } catch (err) {
        toast(`Upload of ${file.name} failed: ${err.message}`, "error", 10000);
      } finally {
        progress.remove();
      }
    }
    this.refreshFiles();
  }

  // A download link, fetched with the key (a plain link cannot send the header).
  async download(link) {
    const name = link.getAttribute("download") || "";
    const progress = toast(`Downloading ${name}…`, "info", 600000);
    try {
      const resp = await request("GET", link.href);
      const url = URL.createObjectURL(await resp.blob());
      const save = el("a");
      save.href = url;
      save.download = name;
      save.hidden = true;
      document.body.append(save);
      save.click();
      save.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
    } catch (err) {
      if (err.status !== 401) toast(`Download of ${name} failed: ${err.message}`, "error", 10000);
    } finally {
      progress.remove();
    }
  }

  bindDrop() {
    const overlay = $("drop-overlay");
    let depth = 0;
    const hasFiles = (e) => e.dataTransfer && Array.from(e.dataTransfer.types || []).includes("Files");
    window.addEventListener("dragenter", (e) => {
      if (!this.sessionId || this.ended || !hasFiles(e)) return;
      depth++;
      overlay.hidden = false;
    });
    window.addEventListener("dragleave", () => {
      depth = Math.max(0, depth - 1);
      if (!depth) overlay.hidden = true;
    });
    window.addEventListener("dragover", (e) => {
      if (hasFiles(e)) e.preventDefault();
    });
    window.addEventListener("drop", (e) => {
      if (!hasFiles(e)) return;
      e.preventDefault();
      depth = 0;
      overlay.hidden = true;
      this.upload(Array.from(e.dataTransfer.files));
    });
  }
}

const app = new App();
window.kernelgw = app; // for the browser console (and the end-to-end tests)
app.start();
