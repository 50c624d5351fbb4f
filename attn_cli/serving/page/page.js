// The page of `attn serve`: translate with POST /v1/translate and show, for a picked sentence,
// its encoder self-attention, decoder causal self-attention and cross-attention as heatmaps.
// Plain DOM, no framework and nothing fetched from elsewhere: the page must work offline.
//
// The heatmaps are CSS grids of elements (not a canvas) so that each weight is an element with
// data-row, data-col and data-weight, which a test, a screen reader and the title tooltip can read.
"use strict";

const KINDS = ["encoder", "decoder_self", "cross"];
// Each kind's axes: which token list labels its rows (queries) and its columns (keys), and which
// selector picks its layer (decoder self-attention and cross-attention are both decoder layers).
const AXES = {
  encoder: { rows: "source_tokens", cols: "source_tokens", layer: "encoder-layer" },
  decoder_self: { rows: "output_tokens", cols: "decoder_input_tokens", layer: "decoder-layer" },
  cross: { rows: "output_tokens", cols: "source_tokens", layer: "decoder-layer" },
};
const SPECIAL = new Set(["<s>", "</s>", "<unk>", "<pad>"]);

const state = {
  models: [], // GET /v1/models
  apiKeyRequired: false, // GET /health
  maxAttentionSentences: 0, // GET /health: the most lines a request may ask attention for (0: unknown)
  busy: false,
  sentences: [], // the last answer's sentences, in order
  selected: -1, // index into state.sentences
};

const $ = (id) => document.getElementById(id);

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// ---- talking to the server ----------------------------------------------------------------------

// The server answers every refusal as {"error": "..."} with a 4xx status: show that sentence as it is.
async function requestJSON(url, options) {
  let response;
  try {
    response = await fetch(url, options);
  } catch (error) {
    throw new Error(`cannot reach the server (${error.message}); is attn serve still running?`);
  }
  let body = null;
  try {
    body = await response.json();
  } catch (error) {
    throw new Error(`${url}: the server answered ${response.status} ${response.statusText}, not JSON`);
  }
  if (!response.ok || (body && body.error)) {
    throw new Error((body && body.error) || `${url}: the server answered ${response.status}`);
  }
  return body;
}

function showError(message) {
  const box = $("error");
  box.textContent = message || "";
  box.hidden = !message;
}

function setStatus(message) {
  $("status").textContent = message || "";
}

async function loadServer() {
  try {
    const [health, listed] = await Promise.all([requestJSON("health"), requestJSON("v1/models")]);
    state.apiKeyRequired = Boolean(health.api_key_required);
    state.maxAttentionSentences = (health.limits && health.limits.max_attention_sentences) || 0;
    $("api-key-field").hidden = !state.apiKeyRequired;
    state.models = listed.models || [];
  } catch (error) {
    showError(error.message);
    return;
  }
  const picker = $("model");
  picker.replaceChildren();
  for (const model of state.models) {
    const label = `${model.name} (${model.source} → ${model.target})` + (model.attention ? "" : ", no attention");
    const option = element("option", "", label);
    option.value = model.name;
    picker.append(option);
  }
  showModelNote();
  useModelDefaults();
}

// The beam starts at the model's own decode setting, as `attn translate` would decode; the n-best
// list shows up to three of its hypotheses.
function useModelDefaults() {
  const model = currentModel();
  if (!model || !model.decode) return;
  $("beam-size").value = model.decode.beam_size;
  $("n-best").value = Math.min(3, model.decode.beam_size);
}

function currentModel() {
  return state.models.find((model) => model.name === $("model").value) || null;
}

function showModelNote() {
  const model = currentModel();
  const note = $("model-note");
  note.hidden = !model || model.attention;
  if (model && !model.attention) {
    note.textContent =
      `${model.name} is served by ${model.backend}, which gives no attention weights: ` +
      "translations only. Serve a checkpoint (--run or --checkpoint) to see the attention.";
  }
}

// The request body: POST /v1/translate takes the options of `attn translate` by their names.
function requestBody(text) {
  const model = currentModel();
  const body = {
    q: text,
    beam_size: Number($("beam-size").value),
    n_best: Number($("n-best").value),
  };
  if (model) body.model = model.name;
  // Alignment comes from the attention too, so a model without attention is asked for neither
  // (the server refuses both for it), and nor is a text of more lines than the server gives
  // attention for in one request: it is translated without, and the note says so.
  const lines = text.split("\n").length;
  const tooMany = state.maxAttentionSentences > 0 && lines > state.maxAttentionSentences;
  const wanted = model && model.attention && $("show-attention").checked;
  if (wanted && !tooMany) {
    body.attention = true;
    body.alignment = true;
  }
  const note = $("attention-note");
  note.hidden = !(wanted && tooMany);
  note.textContent = note.hidden
    ? ""
    : `Attention is shown for up to ${state.maxAttentionSentences} lines at a time: ` +
      `these ${lines} lines are translated without it.`;
  if (state.apiKeyRequired) body.api_key = $("api-key").value;
  return body;
}

async function translate() {
  if (state.busy) return;
  // Blank lines at the end are what a textarea collects, not sentences to translate.
  const text = $("source").value.replace(/(\r?\n[ \t]*)+$/, "");
  if (!text.trim()) {
    showError("Type or paste some text to translate first.");
    return;
  }
  showError("");
  state.busy = true;
  $("translate").disabled = true;
  setStatus("Translating…");
  const started = performance.now();
  try {
    const answer = await requestJSON("v1/translate", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(requestBody(text)),
    });
    const seconds = (performance.now() - started) / 1000;
    const sentences = answer.translations.flatMap((translation) => translation.sentences);
    showTranslation(answer);
    setStatus(`${sentences.length} sentence${sentences.length === 1 ? "" : "s"} in ${seconds.toFixed(2)} s`);
  } catch (error) {
    setStatus("");
    clearTranslation(); // the error is about this text: an older translation must not stand beside it
    showError(error.message);
  } finally {
    state.busy = false;
    $("translate").disabled = false;
  }
}

// ---- the translation and its sentences ----------------------------------------------------------

function clearTranslation() {
  state.sentences = [];
  state.selected = -1;
  $("translation").textContent = "";
  $("sentences").replaceChildren();
  $("output-panel").hidden = true;
  $("attention-panel").hidden = true;
}

function showTranslation(answer) {
  // One text was sent, so there is one translation: its sentences are the lines of the textarea.
  $("translation").textContent = answer.translations.map((translation) => translation.translation).join("\n");
  state.sentences = answer.translations.flatMap((translation) => translation.sentences);
  const list = $("sentences");
  list.replaceChildren();
  state.sentences.forEach((sentence, index) => list.append(sentenceRow(sentence, index)));
  $("output-panel").hidden = false;
  // Show the first sentence that has attention at once: one click fewer for the common case.
  const first = state.sentences.findIndex((sentence) => sentence.attention);
  if (first >= 0) {
    selectSentence(first);
  } else {
    state.selected = -1;
    $("attention-panel").hidden = true;
  }
}

function sentenceRow(sentence, index) {
  const row = element("li", "sentence");
  row.dataset.index = String(index);
  const main = element("div", "sentence-main");
  main.append(element("span", "sentence-number", String(index + 1)));
  const texts = element("div", "sentence-texts");
  texts.append(element("div", "sentence-source", sentence.source));
  texts.append(element("div", "sentence-translation", sentence.translation));
  main.append(texts);
  const figures = element("div", "sentence-figures");
  const alternatives = sentence.n_best && sentence.n_best.length > 1;
  if (sentence.source.trim()) {
    // An empty line has nothing to be confident about (the server says 1.0): no figures for it.
    const confidence = element("span", "confidence", `${Math.round(sentence.confidence * 100)}%`);
    confidence.title =
      `confidence ${sentence.confidence.toFixed(3)}: the geometric mean of the probabilities ` +
      "of the tokens the model chose";
    confidence.style.setProperty("--confidence", String(sentence.confidence));
    figures.append(confidence);
    // The n-best list shows each score; without one, the best translation's score goes here.
    if (!alternatives) figures.append(scoreOf(sentence.score));
  }
  main.append(figures);
  row.append(main);
  if (alternatives) {
    const list = element("ol", "nbest");
    for (const hypothesis of sentence.n_best) {
      const item = element("li");
      item.append(element("span", "nbest-translation", hypothesis.translation));
      item.append(scoreOf(hypothesis.score));
      list.append(item);
    }
    row.append(list);
  }
  const notes = (sentence.notes || []).map((note) => note.message).join("; ");
  if (notes) row.append(element("div", "sentence-note", notes));
  if (sentence.attention) {
    // A focusable row that Enter or Space picks, like a button, so the keyboard can pick it too.
    row.tabIndex = 0;
    row.setAttribute("role", "button");
    row.setAttribute("aria-pressed", "false");
    row.addEventListener("click", () => selectSentence(index));
    row.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") {
        event.preventDefault();
        selectSentence(index);
      }
    });
  } else {
    row.classList.add("no-attention");
    row.title = sentence.source.trim() ? "no attention for this sentence" : "an empty line";
  }
  return row;
}

function scoreOf(value) {
  const score = element("span", "score", value.toFixed(2));
  score.title = "score: the log-probability the search ranked by";
  return score;
}

function selectSentence(index) {
  state.selected = index;
  for (const row of $("sentences").children) {
    const picked = Number(row.dataset.index) === index;
    row.classList.toggle("selected", picked);
    if (row.hasAttribute("aria-pressed")) row.setAttribute("aria-pressed", String(picked));
  }
  const sentence = state.sentences[index];
  // A line longer than the model takes was translated in parts (or cut): its note says so, and
  // the server's attention is of the first part alone.
  const note = sentence.note ? ` (${sentence.note}; the heatmaps show the first part)` : "";
  $("attention-sentence").textContent = `sentence ${index + 1}: ${sentence.source}${note}`;
  fillLayerSelectors(sentence.attention);
  $("attention-panel").hidden = false;
  drawHeatmaps();
}

// ---- the heatmaps -------------------------------------------------------------------------------

// Keep the chosen layer and head when another sentence is picked: one keeps comparing a head.
function fillSelector(select, options, preferred) {
  select.replaceChildren();
  for (const [value, label] of options) {
    const option = element("option", "", label);
    option.value = value;
    select.append(option);
  }
  const values = options.map(([value]) => value);
  select.value = values.includes(preferred) ? preferred : values[values.length - 1];
}

function fillLayerSelectors(attention) {
  const layers = (kind) => attention[kind].length;
  const numbered = (count, name) => Array.from({ length: count }, (_, i) => [String(i), `${name} ${i}`]);
  // The last layer first shown, as `attn translate --show-attention` does; the mean of the heads.
  fillSelector($("encoder-layer"), numbered(layers("encoder"), "layer"), $("encoder-layer").value);
  fillSelector($("decoder-layer"), numbered(layers("cross"), "layer"), $("decoder-layer").value);
  const heads = attention.cross[0].length;
  fillSelector($("head"), [...numbered(heads, "head"), ["mean", `mean of ${heads} heads`]], $("head").value || "mean");
}

// One (queries × keys) grid: a head's weights, or the mean of the layer's heads.
function gridOf(weights, layer, head) {
  const heads = weights[layer];
  if (head !== "mean") return heads[Number(head)];
  return heads[0].map((row, query) =>
    row.map((_, key) => heads.reduce((sum, grid) => sum + grid[query][key], 0) / heads.length),
  );
}

function drawHeatmaps() {
  const sentence = state.sentences[state.selected];
  if (!sentence || !sentence.attention) return;
  const attention = sentence.attention;
  const head = $("head").value;
  // The word alignment pairs (output token, source token) index the cross-attention's rows and
  // columns (its </s> row and column aside): outline them.
  const aligned = new Set((sentence.alignment || []).map(([target, source]) => `${target},${source}`));
  for (const kind of KINDS) {
    const axes = AXES[kind];
    const layer = Number($(axes.layer).value);
    drawHeatmap($(`heatmap-${kind}`), {
      kind,
      rows: attention[axes.rows],
      cols: attention[axes.cols],
      grid: gridOf(attention[kind], layer, head),
      aligned: kind === "cross" ? aligned : null,
    });
    const heads = attention[kind][layer].length;
    $(`which-${kind}`).textContent =
      `layer ${layer} of ${attention[kind].length}, ` + (head === "mean" ? `mean of ${heads} heads` : `head ${head}`);
    $(`readout-${kind}`).innerHTML = "&nbsp;";
  }
}

// A token as shown on an axis: SentencePiece's "▁" (a space before the piece) is kept as a dimmed
// marker, since a piece that is only a space would otherwise be invisible; specials are set apart.
function tokenLabel(token, className) {
  const label = element("div", className);
  label.title = token;
  if (SPECIAL.has(token)) {
    label.classList.add("special");
    label.textContent = token;
    return label;
  }
  for (const part of token.split(/(▁)/)) {
    if (!part) continue;
    label.append(part === "▁" ? element("span", "sp", "▁") : document.createTextNode(part));
  }
  return label;
}

// Weight 0..1 to a colour from near white to deep blue. The square root spreads the small weights
// (most of a row's weights are small) over more shades; the legend shows the same scale.
function shade(weight) {
  const t = Math.sqrt(Math.min(1, Math.max(0, weight)));
  const lightness = 98 - 66 * t;
  return `hsl(${218 - 8 * t} ${55 + 35 * t}% ${lightness}%)`;
}

function formatWeight(weight) {
  return weight.toFixed(2);
}

function drawHeatmap(container, { kind, rows, cols, grid, aligned }) {
  // Cells shrink as sentences grow, so a long sentence still fits beside the others.
  const size = Math.max(12, Math.min(28, Math.floor(380 / Math.max(cols.length, rows.length, 1))));
  container.style.setProperty("--cell", `${size}px`);
  container.style.gridTemplateColumns = `auto repeat(${cols.length}, var(--cell))`;
  container.classList.toggle("dense", size < 20);
  const nodes = [element("div", "corner")];
  cols.forEach((token, col) => {
    const label = tokenLabel(token, "label col-label");
    label.dataset.col = String(col);
    nodes.push(label);
  });
  grid.forEach((weights, row) => {
    const label = tokenLabel(rows[row], "label row-label");
    label.dataset.row = String(row);
    nodes.push(label);
    weights.forEach((weight, col) => {
      const cell = element("div", "cell");
      cell.dataset.row = String(row);
      cell.dataset.col = String(col);
      cell.dataset.weight = String(weight);
      cell.style.background = shade(weight);
      // Decoder query i has seen decoder inputs 0..i only: the rest is the causal mask.
      const masked = kind === "decoder_self" && col > row;
      if (masked) cell.classList.add("masked");
      if (aligned && aligned.has(`${row},${col}`)) cell.classList.add("aligned");
      cell.title = `${rows[row]} → ${cols[col]}: ${formatWeight(weight)}` + (masked ? " (masked)" : "");
      nodes.push(cell);
    });
  });
  container.replaceChildren(...nodes);
}

// One listener per heatmap, not per cell: light up the hovered cell's row and column labels and
// write its weight under the heatmap, where it stays readable while the pointer moves on.
function followPointer(kind) {
  const container = $(`heatmap-${kind}`);
  const readout = $(`readout-${kind}`);
  const clear = () => container.querySelectorAll(".hot").forEach((node) => node.classList.remove("hot"));
  container.addEventListener("mouseover", (event) => {
    const cell = event.target.closest(".cell");
    if (!cell) return;
    clear();
    const { row, col } = cell.dataset;
    container.querySelector(`.row-label[data-row="${row}"]`).classList.add("hot");
    container.querySelector(`.col-label[data-col="${col}"]`).classList.add("hot");
    readout.textContent = cell.title;
  });
  container.addEventListener("mouseleave", () => {
    clear();
    readout.innerHTML = "&nbsp;";
  });
}

// ---- wiring -------------------------------------------------------------------------------------

function start() {
  $("translate").addEventListener("click", translate);
  document.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      translate();
    }
  });
  $("model").addEventListener("change", () => {
    showModelNote();
    useModelDefaults();
  });
  // A beam of k keeps at most k translations: n-best follows the beam size down.
  $("beam-size").addEventListener("change", () => {
    const beam = Number($("beam-size").value);
    if (Number($("n-best").value) > beam) $("n-best").value = String(beam);
  });
  for (const id of ["encoder-layer", "decoder-layer", "head"]) $(id).addEventListener("change", drawHeatmaps);
  for (const kind of KINDS) followPointer(kind);
  // The legend's bar from the cells' own scale, so the two cannot disagree.
  const stops = Array.from({ length: 11 }, (_, i) => shade(i / 10));
  document.querySelector(".legend .scale").style.background = `linear-gradient(to right, ${stops.join(", ")})`;
  $("copy").addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText($("translation").textContent);
      setStatus("Copied the translation.");
    } catch (error) {
      setStatus("The browser did not let the page copy; select the text instead.");
    }
  });
  loadServer();
}

start();
