// clef-tt demo page: editors for a SystemOne request (state, images, typed questions), presets, the
// answer with a bar for every option probability, and a replay mode that runs labelled JSONL
// records and keeps a running accuracy. Everything goes through the public HTTP API.
"use strict";

const $ = (id) => document.getElementById(id);

const LONG_THREAD = [
  "Incident thread #4471 (payments platform).",
  "09:02 UTC - Monitoring: error rate on the card authorisation service rose from 0.2% to 14% in five minutes.",
  "09:04 UTC - On-call: the spike lines up with the 08:55 deploy of the fraud-scoring sidecar; rollback started.",
  "09:11 UTC - Support: 37 tickets from merchants in Germany and France saying that card payments fail at checkout with code 502.",
  "09:15 UTC - On-call: rollback finished but errors stay at 11%; the sidecar's connection pool to the ledger database is exhausted.",
  "09:21 UTC - Database team: the ledger primary shows lock waits on the settlements table; a long batch job started at 08:50.",
  "09:26 UTC - Support: a large marketplace merchant threatens to switch providers if payments are not back within the hour.",
  "09:30 UTC - On-call: batch job paused; error rate falling, 4% now.",
  "09:41 UTC - Monitoring: error rate back to 0.3%; queued retries are draining.",
  "09:45 UTC - Support: merchants ask whether customers were charged twice for the retried payments and who pays the fees.",
].join("\n");

const PRESETS = {
  triage: {
    mode: "text",
    state:
      "Since 09:10 UTC our checkout page returns 502 errors and no customer can pay. Orders are " +
      "piling up and our support lines are full. Please escalate.",
    questions: [
      {
        key: "team",
        type: "choice",
        instructions: "Which team should handle the message?",
        criteria: "billing: Payments, invoices or refunds\ntechnical: Bugs, errors or outages\naccount: Logins, passwords or profile changes",
      },
      { key: "urgency", type: "score", instructions: "How urgent is it?", criteria: "Can wait\nThis week\nToday\nRight now" },
      { key: "outage", type: "noul", instructions: "Is a service down?", criteria: "" },
    ],
  },
  invoice: {
    mode: "json",
    state: JSON.stringify(
      {
        invoice_id: "INV-2041",
        vendor: "Acme Cloud GmbH",
        currency: "EUR",
        lines: [
          { item: "Compute, October", amount: 1840.5 },
          { item: "Support plan", amount: 300 },
        ],
        total: 2140.5,
        payments: [
          { date: "2026-11-02", amount: 2140.5 },
          { date: "2026-11-03", amount: 2140.5 },
        ],
        note: "Customer reports being charged twice.",
      },
      null,
      2,
    ),
    questions: [
      { key: "duplicate", type: "noul", instructions: "Was the invoice paid more than once?", criteria: "" },
      {
        key: "category",
        type: "choice",
        instructions: "What was bought?",
        criteria: "cloud: Cloud or hosting services\ntravel: Travel and expenses\noffice: Office supplies",
      },
      { key: "refund_priority", type: "score", instructions: "How soon should a refund go out?", criteria: "Low\nNormal\nHigh" },
    ],
  },
  repeated: {
    mode: "text",
    state: LONG_THREAD,
    note: "Decide twice: the second request reuses the cached state (x-clef-prefix-cache: hit), which shows in the latency and the counters below.",
    questions: [
      { key: "escalate", type: "noul", instructions: "Should this go to the incident manager?", criteria: "" },
      {
        key: "owner",
        type: "choice",
        instructions: "Which team owns the root cause?",
        criteria: "database: The database team\npayments: The payments platform team\nsupport: Customer support",
      },
    ],
  },
};

// ---- API ---------------------------------------------------------------------------------

function apiKey() {
  return $("api-key").value.trim();
}

function headers(json) {
  const h = { Accept: "application/json" };
  if (json) h["Content-Type"] = "application/json";
  const key = apiKey();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

// POST one request; resolves to {ok, status, body, wallMs, cache, requestId}, never rejects.
async function decide(request) {
  const started = performance.now();
  try {
    const resp = await fetch("/v1/systemone", { method: "POST", headers: headers(true), body: JSON.stringify(request) });
    const text = await resp.text();
    let body;
    try {
      body = JSON.parse(text);
    } catch {
      body = { raw: text };
    }
    return {
      ok: resp.ok,
      status: resp.status,
      body,
      wallMs: performance.now() - started,
      cache: resp.headers.get("x-clef-prefix-cache") || "",
      requestId: resp.headers.get("x-request-id") || "",
    };
  } catch (e) {
    return { ok: false, status: 0, body: { raw: String(e) }, wallMs: performance.now() - started };
  }
}

// A readable text for a failed response: status, kind and every detail with its field path.
function describeError(result) {
  if (result.status === 0) return `The server could not be reached: ${result.body.raw}`;
  const b = result.body || {};
  const kind = (b.error && b.error.type) || "";
  const lines = [`HTTP ${result.status}${kind ? ` (${kind})` : ""}`];
  if (Array.isArray(b.detail)) {
    for (const d of b.detail) {
      const path = (d.loc || []).filter((p) => p !== "body").join(" › ");
      lines.push(path ? `${path}: ${d.msg}` : String(d.msg));
    }
  } else if (b.error && b.error.message) {
    lines.push(b.error.message);
  } else if (b.raw) {
    lines.push(b.raw);
  }
  if (result.status === 401) lines.push("Enter the server's API key in the field at the top right.");
  return lines.join("\n");
}

function showError(text) {
  const box = $("error");
  box.textContent = text;
  box.hidden = !text;
}

let modelName = "clef";

async function refreshServer() {
  const status = $("server-status");
  try {
    const health = await (await fetch("/health")).json();
    const models = await fetch("/v1/models", { headers: headers(false) });
    if (models.ok) {
      const card = (await models.json()).models[0];
      modelName = card.name;
      status.textContent = `${card.name} · ${health.status} · ${health.workers_ready}/${health.workers} workers`;
      return card;
    }
    status.textContent = `${health.status} · ${models.status === 401 ? "API key needed" : `models: HTTP ${models.status}`}`;
  } catch (e) {
    status.textContent = `unreachable (${e})`;
  }
  return null;
}

// ---- The request editors -----------------------------------------------------------------

function addQuestion(q) {
  const node = $("question-template").content.firstElementChild.cloneNode(true);
  node.querySelector(".q-key").value = q.key || "";
  node.querySelector(".q-type").value = q.type || "choice";
  node.querySelector(".q-instructions").value = q.instructions || "";
  node.querySelector(".q-criteria").value = q.criteria || "";
  node.querySelector(".q-remove").addEventListener("click", () => {
    node.remove();
    updatePreview();
  });
  node.querySelector(".q-type").addEventListener("change", () => placeholders(node));
  node.addEventListener("input", updatePreview);
  placeholders(node);
  $("questions").appendChild(node);
}

function placeholders(node) {
  const type = node.querySelector(".q-type").value;
  node.querySelector(".q-criteria").placeholder = {
    choice: "one option per line: name: what it means",
    score: "one level per line, lowest first (levels are 0, 1, 2, …)",
    noul: "optional: true: what yes means / false: what no means",
  }[type];
}

// "name: description" lines as an ordered object (a line without ':' names and describes itself).
function namedLines(text) {
  const out = {};
  for (const line of text.split("\n").map((l) => l.trim()).filter(Boolean)) {
    const at = line.indexOf(":");
    const name = at > 0 ? line.slice(0, at).trim() : line;
    out[name] = at > 0 ? line.slice(at + 1).trim() : line;
  }
  return out;
}

// The request the editors describe; throws an Error with a readable message.
function buildRequest() {
  const mode = document.querySelector("input[name=state-mode]:checked").value;
  const raw = $("state").value;
  let state = raw;
  if (mode === "json") {
    try {
      state = JSON.parse(raw);
    } catch (e) {
      throw new Error(`The state is not valid JSON: ${e.message}`);
    }
  }
  const questions = {};
  for (const node of document.querySelectorAll("#questions .question")) {
    const key = node.querySelector(".q-key").value.trim();
    const type = node.querySelector(".q-type").value;
    const instructions = node.querySelector(".q-instructions").value.trim();
    const criteria = node.querySelector(".q-criteria").value;
    if (!key) throw new Error("Every question needs a key.");
    if (key in questions) throw new Error(`Two questions use the key "${key}".`);
    const q = { type };
    if (instructions) q.instructions = instructions;
    if (type === "choice") q.criteria = namedLines(criteria);
    if (type === "score") q.criteria = criteria.split("\n").map((l) => l.trim()).filter(Boolean);
    if (type === "noul" && criteria.trim()) q.criteria = namedLines(criteria);
    questions[key] = q;
  }
  const request = { model: modelName, state, questions };
  if (images.length) request.images = images.map((i) => i.url);
  return request;
}

// The preview shortens data URLs (an image is megabytes of base64).
function shortened(key, value) {
  if (typeof value === "string" && value.startsWith("data:") && value.length > 80) {
    return `${value.slice(0, value.indexOf(",") + 1)}… (${value.length} characters)`;
  }
  return value;
}

function updatePreview() {
  try {
    $("request-preview").textContent = JSON.stringify(buildRequest(), shortened, 2);
  } catch (e) {
    $("request-preview").textContent = e.message;
  }
}

// ---- Images ------------------------------------------------------------------------------

// Images attached to the state, sent in `images` as data URLs: { name, url }.
let images = [];

function readAsDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function addImages(files) {
  for (const file of files) images.push({ name: file.name, url: await readAsDataUrl(file) });
  $("images").value = "";
  showImages();
}

function showImages() {
  $("image-thumbs").replaceChildren(
    ...images.map((i) => {
      const img = document.createElement("img");
      img.src = i.url;
      img.alt = img.title = i.name;
      return img;
    }),
  );
  $("clear-images").hidden = images.length === 0;
  $("image-list").textContent = images.length ? images.map((i) => i.name).join(", ") : "";
  updatePreview();
}

function loadPreset(name) {
  const p = PRESETS[name];
  document.querySelector(`input[name=state-mode][value=${p.mode}]`).checked = true;
  $("state").value = p.state;
  $("questions").replaceChildren();
  p.questions.forEach(addQuestion);
  $("preset-note").textContent = p.note || "";
  images = [];
  showImages();
}

// ---- Answers -----------------------------------------------------------------------------

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// One bar: label, fill width = probability, the value as the API sent it.
function bar(question, option, label, p, top) {
  const row = el("div", `bar-row${top ? " top" : ""}`);
  row.dataset.question = question;
  row.dataset.option = option;
  row.dataset.probability = String(p);
  const name = el("span", "bar-label", label);
  name.title = label;
  const track = el("div", "bar-track");
  const fill = el("div", "bar-fill");
  fill.style.width = `${Math.max(0, Math.min(1, p)) * 100}%`;
  track.appendChild(fill);
  row.append(name, track, el("span", "bar-value", p.toFixed(4)));
  return row;
}

// The level with the highest probability (the first one on a tie).
function topLevel(probabilities) {
  let best = null;
  for (const [level, p] of Object.entries(probabilities)) {
    if (best === null || p > probabilities[best]) best = level;
  }
  return best;
}

function renderAnswer(key, a) {
  const card = el("div", "answer");
  card.dataset.question = key;
  card.appendChild(el("h3", null, `${key} · ${a.type}`));
  const result = el("div", "result");
  result.dataset.role = "result";
  card.appendChild(result);
  if (a.type === "choice") {
    result.textContent = `${a.choice} · confidence ${a.confidence.toFixed(4)}`;
    for (const [option, p] of Object.entries(a.probabilities)) card.appendChild(bar(key, option, option, p, option === a.choice));
  } else if (a.type === "score") {
    const top = topLevel(a.probabilities);
    result.textContent = `score ${a.score.toFixed(4)} · most likely ${top} (${a.legend[top]}) · confidence ${a.confidence.toFixed(4)}`;
    for (const [level, p] of Object.entries(a.probabilities)) {
      card.appendChild(bar(key, level, `${level} · ${a.legend[level]}`, p, level === top));
    }
  } else if (a.type === "noul") {
    result.textContent = `${a.noul >= 0.5 ? "yes" : "no"} · P(true) = ${a.noul.toFixed(4)}`;
    card.appendChild(bar(key, "true", "true", a.noul, a.noul >= 0.5));
    const no = Math.round((1 - a.noul) * 1e4) / 1e4;
    card.appendChild(bar(key, "false", "false (1 − P)", no, a.noul < 0.5));
  } else {
    result.textContent = JSON.stringify(a);
  }
  return card;
}

function meta(pairs) {
  const box = $("meta");
  box.replaceChildren();
  for (const [label, value, role] of pairs) {
    const span = el("span");
    span.dataset.role = role;
    span.append(`${label} `, el("b", null, value));
    box.appendChild(span);
  }
}

async function showCacheCounters() {
  const box = $("cache");
  const resp = await fetch("/v1/models", { headers: headers(false) }).catch(() => null);
  if (!resp || !resp.ok) return;
  const c = (await resp.json()).models[0].counters || {};
  box.dataset.hits = c.prefix_cache_hits;
  box.dataset.misses = c.prefix_cache_misses;
  box.textContent = `prefix cache counters: ${c.prefix_cache_hits} hits · ${c.prefix_cache_misses} misses · ${c.prefix_cache_evictions} evictions`;
}

async function runAsk() {
  showError("");
  let request;
  try {
    request = buildRequest();
  } catch (e) {
    showError(e.message);
    return;
  }
  $("run").disabled = true;
  $("run-status").textContent = "deciding…";
  const r = await decide(request);
  $("run").disabled = false;
  $("run-status").textContent = "";
  if (!r.ok) {
    showError(describeError(r));
    return;
  }
  meta([
    ["input tokens", String(r.body.usage.input_tokens), "tokens"],
    ["model latency", r.body.latency_ms !== undefined ? `${r.body.latency_ms} ms` : "–", "latency"],
    ["wall clock", `${r.wallMs.toFixed(0)} ms`, "wall"],
    ["prefix cache", r.cache || "–", "cache"],
    ["request", r.requestId, "request-id"],
  ]);
  const answers = $("answers");
  answers.replaceChildren();
  for (const [key, a] of Object.entries(r.body.answers)) answers.appendChild(renderAnswer(key, a));
  await showCacheCounters();
}

// ---- Replay ------------------------------------------------------------------------------

let replayStopped = false;

// Whether an answer matches the expected label (see the panel's explanation).
function matches(answer, expected) {
  if (answer.type === "choice") return answer.choice === expected;
  if (answer.type === "score") return Number(topLevel(answer.probabilities)) === Number(expected);
  if (answer.type === "noul") return answer.noul >= 0.5 === (expected === true || expected === "true");
  return false;
}

function shown(answer) {
  if (answer.type === "choice") return answer.choice;
  if (answer.type === "score") return `${topLevel(answer.probabilities)} (score ${answer.score})`;
  if (answer.type === "noul") return `${answer.noul >= 0.5} (${answer.noul})`;
  return JSON.stringify(answer);
}

async function runReplay() {
  showError("");
  const file = $("replay-file").files[0];
  const text = file ? await file.text() : $("replay-text").value;
  const lines = text.split("\n").map((l) => l.trim()).filter(Boolean);
  if (lines.length === 0) {
    showError("Choose a JSONL file or paste records first.");
    return;
  }
  const tbody = document.querySelector("#replay-table tbody");
  tbody.replaceChildren();
  let correct = 0;
  let total = 0;
  let failed = 0;
  const accuracy = $("replay-accuracy");
  const update = (done) => {
    const pct = total ? ((100 * correct) / total).toFixed(1) : "–";
    accuracy.dataset.correct = correct;
    accuracy.dataset.total = total;
    accuracy.dataset.failed = failed;
    accuracy.textContent = `${done}/${lines.length} records · accuracy ${correct}/${total} (${pct}%)${failed ? ` · ${failed} failed` : ""}`;
  };
  const row = (cells, cls) => {
    const tr = el("tr");
    cells.forEach((c, i) => tr.appendChild(el("td", i === 4 ? cls : null, c)));
    tbody.appendChild(tr);
  };
  replayStopped = false;
  $("replay-run").disabled = true;
  $("replay-stop").disabled = false;
  update(0);
  for (let i = 0; i < lines.length && !replayStopped; i++) {
    let record;
    try {
      record = JSON.parse(lines[i]);
      if (!record || typeof record.request !== "object") throw new Error('no "request" object');
    } catch (e) {
      failed++;
      row([String(i + 1), "", "", `line ${i + 1} is not a record: ${e.message}`, "✗", ""], "bad");
      update(i + 1);
      continue;
    }
    const request = { model: modelName, ...record.request };
    const r = await decide(request);
    if (!r.ok) {
      failed++;
      row([String(i + 1), "", "", describeError(r), "✗", r.wallMs.toFixed(0)], "bad");
      update(i + 1);
      continue;
    }
    for (const [key, expected] of Object.entries(record.expected || {})) {
      const answer = r.body.answers[key];
      const ok = answer !== undefined && matches(answer, expected);
      total++;
      if (ok) correct++;
      row([String(i + 1), key, String(expected), answer ? shown(answer) : "(not asked)", ok ? "✓" : "✗", r.wallMs.toFixed(0)], ok ? "ok" : "bad");
    }
    update(i + 1);
  }
  $("replay-run").disabled = false;
  $("replay-stop").disabled = true;
}

// ---- Wiring ------------------------------------------------------------------------------

function wire() {
  $("api-key").value = sessionStorage.getItem("clef-tt-key") || "";
  $("api-key").addEventListener("change", () => {
    sessionStorage.setItem("clef-tt-key", apiKey());
    refreshServer();
  });
  for (const tab of document.querySelectorAll(".tab")) {
    tab.addEventListener("click", () => {
      for (const t of document.querySelectorAll(".tab")) {
        t.classList.toggle("active", t === tab);
        $(t.dataset.panel).hidden = t !== tab;
      }
    });
  }
  for (const b of document.querySelectorAll("[data-preset]")) b.addEventListener("click", () => loadPreset(b.dataset.preset));
  $("add-question").addEventListener("click", () => addQuestion({ type: "choice" }));
  $("state").addEventListener("input", updatePreview);
  for (const r of document.querySelectorAll("input[name=state-mode]")) r.addEventListener("change", updatePreview);
  $("images").addEventListener("change", (e) => addImages([...e.target.files]).catch((err) => showError(`Could not read the image: ${err}`)));
  $("clear-images").addEventListener("click", () => {
    images = [];
    showImages();
  });
  $("run").addEventListener("click", runAsk);
  $("replay-run").addEventListener("click", runReplay);
  $("replay-stop").addEventListener("click", () => {
    replayStopped = true;
  });
  loadPreset("triage");
  refreshServer().then(updatePreview);
}

wire();
