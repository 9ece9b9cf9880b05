// The search page: plain JavaScript over the server's HTTP API (openapi.yaml), no framework and no build step.
// It calls only what the API offers: collections, adding images, searching images by text, photo or stored
// image, searching captions (annotation), reading an image and its thumbnail.
"use strict";

const $ = (id) => document.getElementById(id);

// ---- the API ------------------------------------------------------------------------------------------------

/** An error answer of the API, with what a person needs to act on it. */
class ApiProblem extends Error {
  constructor(status, code, message, retryAfter) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter;
  }
}

// The key lives in this tab's session only: closing the tab forgets it.
const keyStore = {
  get: () => sessionStorage.getItem("jointspace.key") || "",
  set: (k) => (k ? sessionStorage.setItem("jointspace.key", k) : sessionStorage.removeItem("jointspace.key")),
};

function authHeaders() {
  const key = keyStore.get();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

/** Calls the API; `body` is a FormData (multipart) or a plain object (JSON). Resolves to the response. */
async function call(method, path, body) {
  const headers = authHeaders();
  let payload;
  if (body instanceof FormData) {
    payload = body;
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  let r;
  try {
    r = await fetch(path, { method, headers, body: payload });
  } catch (e) {
    throw new ApiProblem(0, "network", "The server cannot be reached: check that it is running and try again.");
  }
  if (!r.ok) {
    let code = "error";
    let message = `${r.status} ${r.statusText}`;
    try {
      const j = await r.json();
      if (j && j.error) {
        code = j.error.code;
        message = j.error.message;
      }
    } catch (_) {
      // Not the API's JSON (a proxy's page): the status line says enough.
    }
    const retry = parseInt(r.headers.get("Retry-After") || "", 10);
    throw new ApiProblem(r.status, code, message, Number.isFinite(retry) ? retry : undefined);
  }
  return r;
}

async function json(method, path, body) {
  const r = await call(method, path, body);
  return r.status === 204 ? null : r.json();
}

const enc = encodeURIComponent;
const collectionPath = (c) => `/v1/collections/${enc(c)}`;

/** What to tell a person about a failed call. */
function explain(e) {
  if (!(e instanceof ApiProblem)) return `Something went wrong in the page: ${e.message || e}`;
  switch (e.status) {
    case 401:
      return `This server needs an API key: enter it above. (${e.message})`;
    case 403:
      return `This key is not allowed to do that (its role, or the collections it may use). (${e.message})`;
    case 413:
      return `Too large: ${e.message}`;
    case 429: {
      const wait = e.retryAfter !== undefined ? `${e.retryAfter} s` : "a moment";
      return e.code === "rate_limited"
        ? `This key is over its rate. Try again in ${wait}. (${e.message})`
        : `The server is busy (its inference queue is full). Try again in ${wait}. (${e.message})`;
    }
    case 503:
      return `The server cannot answer right now${e.retryAfter !== undefined ? `; try again in ${e.retryAfter} s` : ""}. (${e.message})`;
    default:
      return e.message;
  }
}

// ---- messages -------------------------------------------------------------------------------------------------

function showError(text) {
  const el = $("error");
  el.textContent = text;
  el.hidden = !text;
}

function showStatus(text) {
  $("status").textContent = text;
}

/** Runs an action, showing its errors and clearing the old ones. */
async function attempt(what, fn) {
  showError("");
  try {
    return await fn();
  } catch (e) {
    showError(`${what}: ${explain(e)}`);
    showStatus("");
    return undefined;
  }
}

// ---- thumbnails: fetched with the key (an <img src> cannot send one), shown as object URLs ---------------

const thumbs = new Map();

function thumbnailInto(img, collection, id) {
  const key = `${collection}/${id}`;
  let url = thumbs.get(key);
  if (!url) {
    url = call("GET", `${collectionPath(collection)}/images/${id}/thumbnail`)
      .then((r) => r.blob())
      .then((b) => URL.createObjectURL(b));
    thumbs.set(key, url);
    url.catch(() => thumbs.delete(key));
  }
  url.then(
    (u) => {
      img.src = u;
    },
    () => {
      img.classList.add("missing");
      img.alt = `${img.alt} (no thumbnail)`;
    },
  );
}

function forgetThumbnails() {
  for (const p of thumbs.values()) p.then((u) => URL.revokeObjectURL(u), () => {});
  thumbs.clear();
}

// ---- collections ------------------------------------------------------------------------------------------------

const state = {
  collection: sessionStorage.getItem("jointspace.collection") || "",
  textFields: {}, // collection name -> its text_fields: the first one found names a result

  query: null, // {kind: "text", text} | {kind: "photo", file} | {kind: "image", id}
  offset: 0,
};

async function loadCollections(select) {
  await attempt("Listing collections", async () => {
    const { collections } = await json("GET", "/v1/collections");
    const sel = $("collection");
    sel.replaceChildren();
    if (select) state.collection = select;
    if (!collections.some((c) => c.name === state.collection)) {
      state.collection = collections.length ? collections[0].name : "";
    }
    for (const c of collections) {
      state.textFields[c.name] = c.text_fields || [];
      const o = document.createElement("option");
      o.value = c.name;
      o.textContent = `${c.name} (${c.images} photo${c.images === 1 ? "" : "s"})`;
      o.selected = c.name === state.collection;
      sel.append(o);
    }
    if (!collections.length) {
      const o = document.createElement("option");
      o.value = "";
      o.textContent = "no collections yet: create one below";
      sel.append(o);
    }
    sessionStorage.setItem("jointspace.collection", state.collection);
  });
}

function needCollection() {
  if (!state.collection) {
    showError("Choose a collection first (or create one under “New collection”).");
    return false;
  }
  return true;
}

async function createCollection(ev) {
  ev.preventDefault();
  const name = $("new-name").value.trim();
  const fields = $("new-text-fields").value.split(",").map((f) => f.trim()).filter(Boolean);
  await attempt(`Creating “${name}”`, async () => {
    await json("POST", "/v1/collections", fields.length ? { name, text_fields: fields } : { name });
    $("new-name").value = "";
    $("new-text-fields").value = "";
    // The next thing to do with an empty collection is to fill it.
    $("new-collection").open = false;
    $("add-photos").open = true;
    showStatus(`Collection “${name}” created.`);
    clearResults();
    await loadCollections(name);
  });
}

async function uploadPhotos(ev) {
  ev.preventDefault();
  if (!needCollection()) return;
  const files = [...$("upload-files").files];
  if (!files.length) {
    showError("Adding photos: choose one or more photo files first.");
    return;
  }
  const caption = $("upload-caption").value.trim();
  const metadata = $("upload-metadata").value.trim();
  if (metadata) {
    let m;
    try {
      m = JSON.parse(metadata);
    } catch (e) {
      showError(`Adding photos: the metadata is not valid JSON (${e.message}).`);
      return;
    }
    if (m === null || typeof m !== "object" || Array.isArray(m)) {
      showError('Adding photos: the metadata must be a JSON object, e.g. {"place": "beach"}.');
      return;
    }
  }
  showError("");
  const button = $("upload-button");
  button.disabled = true;
  // One request per photo, so that one bad file is named and the others are still added.
  const failed = [];
  let added = 0;
  for (const [i, f] of files.entries()) {
    showStatus(`Adding photo ${i + 1} of ${files.length}: ${f.name}…`);
    const form = new FormData();
    form.append("image", f, f.name);
    if (caption) form.append("caption", caption);
    if (metadata) form.append("metadata", metadata);
    try {
      await json("POST", `${collectionPath(state.collection)}/images`, form);
      added += 1;
    } catch (e) {
      failed.push(`“${f.name}”: ${explain(e)}`);
    }
  }
  button.disabled = false;
  showStatus(`Added ${added} of ${files.length} photo${files.length === 1 ? "" : "s"} to “${state.collection}”.`);
  if (failed.length) showError(`Some photos were not added. ${failed.join(" ")}`);
  if (added) {
    $("upload-files").value = "";
    await loadCollections();
  }
}

// ---- filters ------------------------------------------------------------------------------------------------------

/** The operators the API's filters take (docs/api.md, "Filters"): label, operator, and what its value is. */
const OPERATORS = [
  ["=", "$eq", "one"],
  ["≠", "$ne", "one"],
  [">", "$gt", "one"],
  ["≥", "$gte", "one"],
  ["<", "$lt", "one"],
  ["≤", "$lte", "one"],
  ["one of", "$in", "list"],
  ["none of", "$nin", "list"],
  ["exists", "$exists", "yes"],
  ["is missing", "$exists", "no"],
];

function addFilterRow(key = "", value = "") {
  const row = document.createElement("div");
  row.className = "row filter";
  const n = $("filter-rows").children.length + 1;
  const k = Object.assign(document.createElement("input"), { value: key, placeholder: "key (a.b for nested)" });
  const op = document.createElement("select");
  for (const [label] of OPERATORS) op.append(Object.assign(document.createElement("option"), { textContent: label }));
  const v = Object.assign(document.createElement("input"), { value, placeholder: "value" });
  k.setAttribute("aria-label", `Filter ${n} key`);
  op.setAttribute("aria-label", `Filter ${n} operator`);
  v.setAttribute("aria-label", `Filter ${n} value`);
  const rm = Object.assign(document.createElement("button"), { type: "button", textContent: "Remove" });
  rm.setAttribute("aria-label", `Remove filter ${n}`);
  rm.addEventListener("click", () => {
    row.remove();
    countFilters();
  });
  for (const i of [k, v]) i.addEventListener("input", countFilters);
  op.addEventListener("change", () => {
    // exists / is missing take no value.
    v.hidden = OPERATORS[op.selectedIndex][2] !== "one" && OPERATORS[op.selectedIndex][2] !== "list";
    v.placeholder = OPERATORS[op.selectedIndex][2] === "list" ? "values, comma-separated" : "value";
    countFilters();
  });
  row.append(k, op, v, rm);
  $("filter-rows").append(row);
  k.focus();
}

/** A typed JSON scalar from what a person typed: true/false and numbers as such, anything else as text. */
function scalar(raw) {
  if (raw === "true" || raw === "false") return raw === "true";
  if (raw !== "" && Number.isFinite(Number(raw))) return Number(raw);
  return raw;
}

/** The filter as the API takes it: {key: value} for "=", {key: {"$op": value}} otherwise; rows on one key join. */
function currentFilter() {
  const f = {};
  let rows = 0;
  for (const row of $("filter-rows").children) {
    const [k, v] = row.querySelectorAll("input");
    const [, operator, kind] = OPERATORS[row.querySelector("select").selectedIndex];
    const key = k.value.trim();
    if (!key) continue;
    const raw = v.value.trim();
    const value =
      kind === "one" ? scalar(raw)
      : kind === "list" ? raw.split(",").map((x) => scalar(x.trim())).filter((x) => x !== "")
      : kind === "yes";
    rows += 1;
    if (operator === "$eq" && !(key in f)) {
      f[key] = value;
      continue;
    }
    // Several conditions on one key all hold: gather them in one operator object.
    const prev = f[key];
    const ops = prev === undefined ? {} : typeof prev === "object" ? prev : { $eq: prev };
    ops[operator] = value;
    f[key] = ops;
  }
  return rows ? f : undefined;
}

function countFilters() {
  const rows = [...$("filter-rows").children].filter((r) => r.querySelector("input").value.trim()).length;
  $("filter-count").textContent = rows ? `(${rows} on)` : "";
}

// ---- searching ------------------------------------------------------------------------------------------------------

const perPage = () => parseInt($("per-page").value, 10);

function clearResults() {
  state.query = null;
  state.offset = 0;
  $("results").replaceChildren();
  $("pager").hidden = true;
  $("query-photo").hidden = true;
  $("results-title").textContent = "Results";
  $("results-empty").hidden = false;
  $("results-empty").textContent = "Search by a sentence or a photo to see results.";
  $("unknown-words").hidden = true;
}

// What the server says each mode did (the answer's `mode`).
const MODES = { vector: "by meaning", keyword: "by words", hybrid: "by meaning and words" };

function describeQuery(q, mode) {
  if (q.kind === "text") return `Photos for “${q.text}”${MODES[mode] ? `, ${MODES[mode]}` : ""}`;
  if (q.kind === "photo") return `Photos like ${q.file.name}`;
  return `More like photo ${q.label}`;
}

async function runSearch() {
  if (!needCollection() || !state.query) return;
  const q = state.query;
  const k = perPage();
  const filter = currentFilter();
  const path = `${collectionPath(state.collection)}/images/search`;
  showStatus("Searching…");
  await attempt("Searching", async () => {
    let answer;
    if (q.kind === "photo") {
      const form = new FormData();
      form.append("image", q.file, q.file.name);
      form.append("k", String(k));
      form.append("offset", String(state.offset));
      if (filter) form.append("filter", JSON.stringify(filter));
      answer = await json("POST", path, form);
    } else {
      const body = { k, offset: state.offset };
      if (q.kind === "text") {
        body.text = q.text;
        // Modes are for sentences only; none given, the collection's default.
        if ($("mode").value) body.mode = $("mode").value;
      } else body.image_id = q.id;
      if (filter) body.filter = filter;
      answer = await json("POST", path, body);
    }
    renderResults(answer, k, filter);
  });
}

function renderResults({ results, mode, unknown_words: unknown }, k, filter) {
  const list = $("results");
  list.replaceChildren();
  $("results-title").textContent = describeQuery(state.query, mode);
  // Words the caption encoder has no vector for add nothing to the meaning; say which, so a person can
  // rephrase (a search by words still finds them in captions and fields).
  const words = state.query.kind === "text" ? unknown || [] : [];
  $("unknown-words").hidden = words.length === 0;
  $("unknown-words").textContent = words.length
    ? `Words the model does not know (they add nothing to the meaning): ${words.join(", ")}.`
    : "";
  const first = state.offset + 1;
  $("results-empty").hidden = results.length > 0;
  $("results-empty").textContent = state.offset
    ? "No more results."
    : `No photos found${filter ? " with these filters" : ""}. Add photos, or loosen the filters.`;
  for (const [i, r] of results.entries()) list.append(card(r, first + i, mode));
  $("pager").hidden = state.offset === 0 && results.length < k;
  $("prev").disabled = state.offset === 0;
  $("next").disabled = results.length < k;
  $("page-info").textContent = results.length
    ? `Results ${first}–${state.offset + results.length}`
    : "";
  showStatus(`${results.length} result${results.length === 1 ? "" : "s"}.`);
}

// A result's name: its first text field with a value (a product's name, say), else its product's key (a grouped
// search's result may be a photo without the product's words), else its external id.
function label(image, product) {
  for (const path of state.textFields[state.collection] || []) {
    const v = path.split(".").reduce((o, k) => (o && typeof o === "object" ? o[k] : undefined), image.metadata);
    if (typeof v === "string" && v.trim()) return v.trim();
  }
  if (product && product.key) return product.key;
  return image.external_id ? image.external_id : `#${image.id}`;
}

// A product's other photos (ImageResult.product), as small thumbnails under the card's photo.
function otherPhotos(product) {
  if (!product || product.photos.length < 2) return null;
  const row = Object.assign(document.createElement("span"), { className: "card-photos" });
  for (const id of product.photos.slice(1, 4)) {
    const t = document.createElement("img");
    t.alt = "";
    t.loading = "lazy";
    t.width = 48;
    t.height = 48;
    thumbnailInto(t, state.collection, id);
    row.append(t);
  }
  row.append(Object.assign(document.createElement("span"), { textContent: `${product.photos.length} photos` }));
  return row;
}

// What a card's score is in each mode (ImageResult.score in openapi.yaml).
const SCORE_MEANS = {
  vector: "similarity score (higher is closer)",
  keyword: "text relevance of the words (higher matches better)",
  hybrid: "fused score of the photo, the words by meaning and the words as keywords (0 is average)",
};

// Why a hybrid or keyword result was found: what each channel said of it (ImageResult.channels).
function why(channels) {
  if (!channels) return "";
  const parts = [];
  if (channels.vector !== undefined) parts.push(`photo ${channels.vector.toFixed(2)}`);
  if (channels.text !== undefined) parts.push(`words ${channels.text.toFixed(2)}`);
  if (channels.keyword !== undefined) parts.push("keywords");
  return parts.join(" · ");
}

function card(result, rank, mode) {
  const { image, score, product } = result;
  const li = document.createElement("li");
  li.className = "card";
  const b = document.createElement("button");
  b.type = "button";
  b.className = "card-open";
  b.setAttribute("aria-label", `Result ${rank}: photo ${label(image, product)}, score ${score.toFixed(3)}. Open details`);
  const img = document.createElement("img");
  img.alt = `Photo ${label(image, product)}`;
  img.loading = "lazy";
  img.width = 256;
  img.height = 256;
  thumbnailInto(img, state.collection, image.id);
  const meta = document.createElement("span");
  meta.className = "card-meta";
  const name = Object.assign(document.createElement("span"), { className: "card-name", textContent: label(image, product) });
  const s = Object.assign(document.createElement("span"), { className: "score", textContent: score.toFixed(3) });
  s.title = SCORE_MEANS[mode] || SCORE_MEANS.vector;
  meta.append(name, s);
  const reasons = why(result.channels);
  if (reasons) meta.append(Object.assign(document.createElement("span"), { className: "card-why", textContent: reasons }));
  const others = otherPhotos(product);
  if (others) meta.append(others);
  b.append(img, meta);
  b.addEventListener("click", () => openDetail(image.id));
  li.append(b);
  return li;
}

function searchText(ev) {
  ev.preventDefault();
  const text = $("query").value.trim();
  if (!text) return;
  state.query = { kind: "text", text };
  state.offset = 0;
  $("query-photo").hidden = true;
  runSearch();
}

async function searchPhoto(file) {
  if (!file || !needCollection()) return;
  state.query = { kind: "photo", file };
  state.offset = 0;
  const preview = $("query-photo-img");
  if (preview.src.startsWith("blob:")) URL.revokeObjectURL(preview.src);
  preview.src = URL.createObjectURL(file);
  $("query-photo").hidden = false;
  $("annotation").replaceChildren();
  await runSearch();
  // Annotation: the collection's captions nearest to the photo.
  await attempt("Finding captions for the photo", async () => {
    const form = new FormData();
    form.append("image", file, file.name);
    form.append("k", "5");
    const { results } = await json("POST", `${collectionPath(state.collection)}/captions/search`, form);
    fillCaptions($("annotation"), results, "No captions in this collection yet.");
  });
}

function fillCaptions(list, results, empty) {
  list.replaceChildren();
  if (!results.length) {
    list.append(Object.assign(document.createElement("li"), { className: "hint", textContent: empty }));
  }
  for (const r of results) {
    const li = document.createElement("li");
    const t = Object.assign(document.createElement("span"), { textContent: r.caption.text });
    const s = Object.assign(document.createElement("span"), { className: "score", textContent: r.score.toFixed(3) });
    li.append(t, s);
    list.append(li);
  }
}

// ---- one photo's details --------------------------------------------------------------------------------------------

let detailImage = null;

async function openDetail(id) {
  const c = state.collection;
  await attempt(`Opening photo ${id}`, async () => {
    const image = await json("GET", `${collectionPath(c)}/images/${id}`);
    detailImage = image;
    $("detail-title").textContent = `Photo ${label(image)}`;
    const img = $("detail-img");
    img.removeAttribute("src");
    img.classList.remove("missing");
    img.alt = `Photo ${label(image)}`;
    thumbnailInto(img, c, id);
    const facts = $("detail-facts");
    facts.replaceChildren();
    const fact = (k, v) => {
      facts.append(Object.assign(document.createElement("dt"), { textContent: k }));
      facts.append(Object.assign(document.createElement("dd"), { textContent: v }));
    };
    fact("Id", String(image.id));
    if (image.external_id) fact("External id", image.external_id);
    fact("Size", `${image.width} × ${image.height} px`);
    fact("Added", image.created_at);
    const meta = Object.entries(image.metadata || {});
    if (!meta.length) fact("Metadata", "none");
    for (const [k, v] of meta) fact(k, typeof v === "string" ? v : JSON.stringify(v));
    const caps = $("detail-captions");
    caps.replaceChildren();
    for (const cap of image.captions || []) {
      caps.append(Object.assign(document.createElement("li"), { textContent: cap.text }));
    }
    if (!(image.captions || []).length) {
      caps.append(Object.assign(document.createElement("li"), { className: "hint", textContent: "none" }));
    }
    $("detail-annotation").replaceChildren();
    const dialog = $("detail");
    if (!dialog.open) dialog.showModal();
    $("detail-close").focus();
    const { results } = await json("POST", `${collectionPath(c)}/captions/search`, { image_id: id, k: 5 });
    fillCaptions($("detail-annotation"), results, "No captions in this collection yet.");
  });
}

function moreLikeThis() {
  if (!detailImage) return;
  state.query = { kind: "image", id: detailImage.id, label: label(detailImage) };
  state.offset = 0;
  $("query-photo").hidden = true;
  $("detail").close();
  runSearch().then(() => $("results-title").focus());
}

// ---- wiring -----------------------------------------------------------------------------------------------------------

function wire() {
  $("api-key").value = keyStore.get();
  $("key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    keyStore.set($("api-key").value.trim());
    forgetThumbnails();
    showStatus(keyStore.get() ? "Key set for this tab." : "No key: calling the server without one.");
    loadCollections();
  });
  $("forget-key").addEventListener("click", () => {
    keyStore.set("");
    $("api-key").value = "";
    forgetThumbnails();
    showStatus("Key forgotten.");
  });
  $("collection").addEventListener("change", (ev) => {
    state.collection = ev.target.value;
    sessionStorage.setItem("jointspace.collection", state.collection);
    clearResults();
  });
  $("reload-collections").addEventListener("click", () => loadCollections());
  $("create-form").addEventListener("submit", createCollection);
  $("upload-form").addEventListener("submit", uploadPhotos);
  $("text-form").addEventListener("submit", searchText);
  $("photo").addEventListener("change", (ev) => searchPhoto(ev.target.files[0]));
  const drop = $("drop");
  drop.addEventListener("dragover", (ev) => {
    ev.preventDefault();
    drop.classList.add("over");
  });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (ev) => {
    ev.preventDefault();
    drop.classList.remove("over");
    const f = ev.dataTransfer && ev.dataTransfer.files[0];
    if (f) searchPhoto(f);
  });
  $("add-filter").addEventListener("click", () => addFilterRow());
  $("per-page").addEventListener("change", () => {
    state.offset = 0;
    runSearch();
  });
  $("mode").addEventListener("change", () => {
    if (state.query && state.query.kind !== "text") return;
    state.offset = 0;
    runSearch();
  });
  $("prev").addEventListener("click", () => {
    state.offset = Math.max(0, state.offset - perPage());
    runSearch();
  });
  $("next").addEventListener("click", () => {
    state.offset += perPage();
    runSearch();
  });
  $("detail-close").addEventListener("click", () => $("detail").close());
  $("more-like-this").addEventListener("click", moreLikeThis);
  $("results-title").tabIndex = -1;
  loadCollections();
}

wire();
