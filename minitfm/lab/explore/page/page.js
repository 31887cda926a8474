/* The explorer page: reads the embedded run (one JSON document), runs the model of model.js
 * on what you type, and draws decoding, attention maps, head switches, the role cards, the
 * patching view and the logit lens (inside.js), attention over training and the run's curves.
 * Everything from the run or from you is shown as text (textContent) or drawn on a canvas,
 * never parsed as markup.
 *
 * window.minitfm is the page's test API: predict(text) (with its logit lens), setHead(kind,
 * layer, head, mode), exactMatch() and patch(clean, corrupt) (Promises), state.
 */
(function () {
  "use strict";

  const M = window.minitfmModel, T = window.minitfmTask, P = window.minitfmPatching;
  const DATA = JSON.parse(document.getElementById("minitfm-data").textContent);
  const model = M.makeModel(DATA.model, M.loadWeights(DATA.model.weights, DATA.model.index));
  const task = T.makeTask(DATA.task);
  const MEANS = Object.fromEntries(Object.entries(DATA.means).map(([k, v]) => [k, M.decodeFloats(v)]));
  const KINDS = ["encoder", "decoder", "cross"];
  const KIND_TITLES = {
    encoder: "encoder self-attention (query: source, key: source)",
    decoder: "decoder self-attention (query: decoder input, key: decoder input)",
    cross: "cross-attention (query: decoder input, key: source)",
  };
  const MODES = ["on", "zero", "mean"];
  const BOS = DATA.model.bos_id, EOS = DATA.model.eos_id;
  const { n_heads: H, n_encoder_layers: NE, n_decoder_layers: ND } = DATA.model.config;
  const layersOf = (kind) => (kind === "encoder" ? NE : ND);

  const state = { input: "", kind: "cross", layer: 0, head: 0, off: {} }; // off: "kind.layer.head" -> mode
  let shown = null; // the prediction on the page
  let patchView = null; // section 5 (inside.js)

  // --- small helpers: elements from text, never from markup ---

  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text != null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }
  const $ = (id) => document.getElementById(id);
  const percent = (x) => (x == null ? "–" : `${(100 * x).toFixed(1)}%`);
  const fixed = (x, digits) => (x == null ? "–" : x.toFixed(digits)); // null: not a number
  const short = (token, n = 6) => (Array.from(token).length > n ? Array.from(token).slice(0, n - 1).join("") + "…" : token);

  // --- the model on typed input ---

  function offList() {
    return Object.entries(state.off).map(([key, mode]) => {
      const [kind, layer, head] = key.split(".");
      return [kind, Number(layer), Number(head), mode];
    });
  }

  function inputLength(src) { // task.input_length: add counts the longer operand
    if (DATA.task.reading === "modadd") return 1; // two one-symbol numbers
    if (DATA.task.reading !== "add") return src.length;
    const plus = DATA.task.tokens.indexOf("+"), i = src.indexOf(plus);
    return Math.max(i, src.length - i - 1);
  }

  function lengthWarning(src) { // evaluate.length_warning, for one input
    const [lo, hi] = DATA.task.trained_lengths, n = inputLength(src);
    return n > hi ? `1 input is longer than the lengths trained on (${lo}..${hi}; the longest has ${n}): expect mistakes` : null;
  }

  /** Decode `text` with the heads switched off now: the output as `minitfm predict` writes
   * it, each step's token, probability and runners-up, every attention map, and the logit
   * lens of the intact model (from the decoder outputs its decoding kept). */
  function predict(text) {
    const read = task.parseInput(String(text));
    if (read.error) return { output: null, error: read.error };
    const cap = task.cap(read.src.length), outputs = [], off = offList().length;
    const switches = M.switchesFor(model, MEANS, offList());
    if (!off) switches.hooks = P.decoderOutputs(outputs);
    const run = M.greedyDecode(model, read.src, cap, switches);
    const written = run.decoded[run.decoded.length - 1] === EOS ? run.decoded.slice(0, -1) : run.decoded;
    let intact = null, all = run.decoded; // what the model writes with every head on
    if (off) {
      all = M.greedyDecode(model, read.src, cap, { ...M.noSwitches(model), hooks: P.decoderOutputs(outputs) }).decoded;
      intact = task.formatLike(all[all.length - 1] === EOS ? all.slice(0, -1) : all, text);
    }
    const lens = P.lensOfDecoding(model, task, read.src, all, outputs);
    const steps = run.steps.map((step) => {
      const probs = M.softmax(Array.from(step.logits));
      const order = probs.map((p, i) => i).sort((a, b) => probs[b] - probs[a] || a - b);
      return { reads: task.token(step.input), writes: task.token(step.token), token: step.token,
               probability: probs[step.token], nearTie: step.nearTie, gap: step.gap,
               runnersUp: order.filter((i) => i !== step.token).slice(0, 3)
                 .map((i) => ({ token: task.token(i), probability: probs[i] })),
               logits: Array.from(step.logits) };
    });
    return { output: task.formatLike(written, text), intact, error: null, src: read.src, decoded: run.decoded,
             source: read.src.map(task.token),
             decoderInput: [BOS, ...run.decoded.slice(0, -1)].map(task.token),
             steps, attention: run.maps, lens, warning: lengthWarning(read.src),
             unknown: task.unknownSymbols(text), nearTies: steps.filter((s) => s.nearTie).length };
  }

  // --- colours: viridis (colour-blind safe), colour ∝ weight^γ as the PNG figures ---

  const STOPS = DATA.palette.map((hex) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16)));
  function colour(weight) { // NaN or null (a diverged model's): the dark end, as the PNGs
    const w = Number.isFinite(weight) ? weight : 0;
    const x = Math.min(Math.max(w, 0), 1) ** DATA.gamma * (STOPS.length - 1);
    const i = Math.min(Math.floor(x), STOPS.length - 2), f = x - i;
    const rgb = STOPS[i].map((c, k) => Math.round(c + f * (STOPS[i + 1][k] - c)));
    return `rgb(${rgb.join(",")})`;
  }

  /** One map on a canvas: rows (T_q, up to T_k values each); cells past a row are masked. */
  function drawCells(ctx, rows, nKeys, cell, x0, y0) {
    rows.forEach((row, i) => {
      for (let j = 0; j < nKeys; j++) {
        const x = x0 + j * cell, y = y0 + i * cell;
        if (j < row.length) {
          ctx.fillStyle = colour(row[j]);
          ctx.fillRect(x, y, cell, cell);
        } else { // masked: grey with a diagonal hatch
          ctx.fillStyle = "#9a9a9a";
          ctx.fillRect(x, y, cell, cell);
          ctx.strokeStyle = "#5a5a5a";
          ctx.beginPath(); ctx.moveTo(x, y + cell); ctx.lineTo(x + cell, y); ctx.stroke();
        }
      }
    });
  }

  function axes(kind, p) { // (query labels, key labels) of a kind's maps
    const rows = p.decoderInput.map((t, i) => `${short(t)}→${short(p.steps[i].writes)}`);
    if (kind === "encoder") return [p.source, p.source];
    return [rows, kind === "decoder" ? p.decoderInput : p.source];
  }

  // sections 4 to 6: role cards, patching, the logit lens (inside.js)
  const inside = window.minitfmInside.makeInside({ data: DATA, model, task, el, $, drawCells, percent, short });

  // --- section 1: decoding ---

  function showDecoding(p) {
    $("error").textContent = p.error ? `error: ${p.error}` : "";
    const notes = [];
    if (p.warning) notes.push(`warning: ${p.warning}`);
    if (p.unknown && p.unknown.length) notes.push(`note: ${p.unknown.map(T.pyRepr).join(", ")} never seen in training, read as <unk>`);
    if (p.nearTies) notes.push(`note: ${p.nearTies} step(s) had a near-tie (two logits within ${M.NEAR_TIE}): PyTorch's float32 sums could pick the other token there`);
    $("warning").textContent = notes.join("\n");
    $("output").textContent = p.error ? "" : (p.output === "" ? "(empty)" : p.output);
    $("verdict").textContent = p.error ? "" : verdict(p);
    const body = $("steps").tBodies[0];
    body.replaceChildren();
    for (const [t, s] of (p.steps || []).entries()) {
      const tr = el("tr");
      tr.append(el("td", t, "num"), el("td", s.reads, "tok"), el("td", s.writes, "tok"),
        el("td", s.probability.toFixed(4) + (s.nearTie ? " (near-tie)" : ""), s.nearTie ? "num near-tie" : "num"),
        el("td", s.runnersUp.map((r) => `${r.token} ${r.probability.toFixed(4)}`).join(" · "), "tok"));
      body.append(tr);
    }
  }

  /** What to say beside the output: right or wrong when the input is a held-out example (the
   * page knows no task's rule, only those examples' targets), and what switched-off heads change. */
  function verdict(p) {
    const parts = [];
    const i = DATA.held_out.sources.findIndex((s) => s.length === p.src.length && s.every((t, k) => t === p.src[k]));
    if (i >= 0) {
      const target = task.formatLike(DATA.held_out.targets[i], state.input);
      parts.push(target === p.output ? "✓ the held-out target" : `✗ the held-out target is ${target}`);
    }
    const off = offList().length;
    if (off) parts.push(`${off} head(s) switched off (section 3); with every head on: ${p.intact === "" ? "(empty)" : p.intact}`);
    return parts.join(" · ");
  }

  // --- section 2: attention maps ---

  function showMaps(p) {
    const box = $("kinds");
    box.replaceChildren();
    if (p.error) { // no maps of another input under "this input"
      $("zoom-title").textContent = "fix the input above to see its attention maps";
      $("zoom-canvas").width = 0; $("zoom-canvas").height = 0;
      $("readout").textContent = "";
      return;
    }
    for (const kind of KINDS) {
      box.append(el("h3", KIND_TITLES[kind]));
      const grid = el("div", null, "grid");
      grid.style.gridTemplateColumns = `max-content repeat(${H}, max-content)`;
      grid.append(el("span", ""));
      for (let h = 0; h < H; h++) grid.append(el("span", `head ${h}`, "label"));
      const [queries, keys] = axes(kind, p);
      for (let l = 0; l < layersOf(kind); l++) {
        grid.append(el("span", `layer ${l}`, "label"));
        for (let h = 0; h < H; h++) {
          const button = el("button", null, "map");
          button.type = "button";
          const selected = kind === state.kind && l === state.layer && h === state.head;
          button.setAttribute("aria-pressed", String(selected));
          button.setAttribute("aria-label", `${kind} layer ${l} head ${h}${state.off[`${kind}.${l}.${h}`] ? " (switched off)" : ""}`);
          const canvas = el("canvas");
          const cell = Math.max(1, Math.floor(72 / Math.max(queries.length, keys.length)));
          canvas.width = keys.length * cell; canvas.height = queries.length * cell;
          drawCells(canvas.getContext("2d"), p.attention[kind][l][h], keys.length, cell, 0, 0);
          button.append(canvas);
          button.addEventListener("click", () => { Object.assign(state, { kind, layer: l, head: h }); update(false); });
          grid.append(button);
        }
      }
      box.append(grid);
    }
    showZoom(p);
  }

  const zoom = { cell: 0, left: 0, top: 0, at: [0, 0] };

  function showZoom(p) {
    const { kind, layer, head } = state;
    const [queries, keys] = axes(kind, p);
    const rows = p.attention[kind][layer][head];
    $("zoom-title").textContent = `${KIND_TITLES[kind]} · layer ${layer} · head ${head}` +
      (state.off[`${kind}.${layer}.${head}`] ? ` · switched off (${state.off[`${kind}.${layer}.${head}`]}): its weights are still computed, its output replaced` : "");
    const canvas = $("zoom-canvas"), ctx = canvas.getContext("2d");
    zoom.cell = Math.max(8, Math.min(32, Math.floor(560 / Math.max(queries.length, keys.length))));
    ctx.font = "12px ui-monospace, monospace";
    zoom.left = 12 + Math.max(...queries.map((q) => ctx.measureText(q).width));
    zoom.top = 12 + Math.max(...keys.map((k) => ctx.measureText(short(k)).width));
    canvas.width = zoom.left + keys.length * zoom.cell + 4;
    canvas.height = zoom.top + queries.length * zoom.cell + 4;
    ctx.font = "12px ui-monospace, monospace";
    ctx.fillStyle = getComputedStyle(document.body).color;
    ctx.textBaseline = "middle"; ctx.textAlign = "right";
    queries.forEach((q, i) => ctx.fillText(q, zoom.left - 6, zoom.top + (i + 0.5) * zoom.cell));
    keys.forEach((k, j) => { // key labels turned upright
      ctx.save(); ctx.translate(zoom.left + (j + 0.5) * zoom.cell, zoom.top - 6);
      ctx.rotate(-Math.PI / 2); ctx.textAlign = "left"; ctx.fillText(short(k), 0, 0); ctx.restore();
    });
    drawCells(ctx, rows, keys.length, zoom.cell, zoom.left, zoom.top);
    const [i, j] = zoom.at;
    if (i < queries.length && j < keys.length) {
      ctx.strokeStyle = "#e07000"; ctx.lineWidth = 2;
      ctx.strokeRect(zoom.left + j * zoom.cell + 1, zoom.top + i * zoom.cell + 1, zoom.cell - 2, zoom.cell - 2);
    }
    readout(p, i, j);
  }

  function readout(p, i, j) {
    const { kind, layer, head } = state;
    const [queries, keys] = axes(kind, p);
    if (!(i >= 0 && i < queries.length && j >= 0 && j < keys.length)) return;
    const row = p.attention[kind][layer][head][i];
    const value = j < row.length ? row[j].toFixed(4) : "masked (a later token)";
    $("readout").textContent = `query ${i} ${queries[i]}  →  key ${j} ${keys[j]}: ${value}`;
  }

  function zoomEvents() {
    const canvas = $("zoom-canvas");
    canvas.addEventListener("mousemove", (event) => {
      const box = canvas.getBoundingClientRect(), scale = canvas.width / box.width;
      const x = (event.clientX - box.left) * scale, y = (event.clientY - box.top) * scale;
      const i = Math.floor((y - zoom.top) / zoom.cell), j = Math.floor((x - zoom.left) / zoom.cell);
      if (shown && !shown.error) readout(shown, i, j);
    });
    canvas.addEventListener("keydown", (event) => {
      const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
      if (!moves[event.key] || !shown || shown.error) return;
      event.preventDefault();
      const [queries, keys] = axes(state.kind, shown);
      const [di, dj] = moves[event.key];
      zoom.at = [Math.min(Math.max(zoom.at[0] + di, 0), queries.length - 1),
                 Math.min(Math.max(zoom.at[1] + dj, 0), keys.length - 1)];
      showZoom(shown);
    });
  }

  function legend() {
    const canvas = el("canvas"), ctx = canvas.getContext("2d");
    canvas.width = 260; canvas.height = 34;
    for (let x = 0; x < 240; x++) { ctx.fillStyle = colour((x / 239) ** (1 / DATA.gamma)); ctx.fillRect(10 + x, 0, 1, 14); }
    ctx.fillStyle = getComputedStyle(document.body).color; ctx.font = "11px sans-serif";
    [0, 0.1, 0.25, 0.5, 1].forEach((w) => ctx.fillText(String(w), 6 + 239 * w ** DATA.gamma, 28));
    canvas.setAttribute("role", "img");
    canvas.setAttribute("aria-label", "colour scale: attention weight 0 (dark purple) to 1 (yellow), square-root scale");
    $("legend").replaceChildren(canvas, el("span", " attention weight (viridis, square-root scale: faint rows stay visible)", "hint"));
  }

  function alignmentTable() {
    const a = DATA.alignment, box = $("alignment");
    if (!a) { box.replaceChildren(el("p", `task '${DATA.task.name}' has no ideal alignment: no alignment score`, "hint")); return; }
    const table = el("table");
    table.append(el("caption", `alignment score of each cross-attention head (held-out, ${a.samples} pairs)`));
    const head = el("tr");
    ["layer", "head", "score", "argmax share", ""].forEach((t) => head.append(el("th", t)));
    table.append(head);
    let best = [0, 0];
    a.soft.forEach((row, l) => row.forEach((v, h) => { if (v > a.soft[best[0]][best[1]]) best = [l, h]; }));
    a.soft.forEach((row, l) => row.forEach((v, h) => {
      const tr = el("tr");
      const isBest = l === best[0] && h === best[1];
      tr.append(el("td", l, "num"), el("td", h, "num"), el("td", fixed(v, 3), "num"),
        el("td", fixed(a.hard[l][h], 3), "num"), el("td", isBest ? "← best" : ""));
      table.append(tr);
    }));
    box.replaceChildren(table, el("p", "score: mean weight on the ideal source position over the target positions (EOS excluded), teacher-forced on the true target, as minitfm visualize-attention computes it: 1 = exact, about 1/S = uniform. Argmax share: how often the strongest key is the ideal one.", "hint"));
  }

  // --- section 3: head switches and live exact match ---

  function switches() {
    const box = $("switches");
    box.replaceChildren();
    for (const kind of KINDS) {
      for (let l = 0; l < layersOf(kind); l++) {
        const line = el("div", null, "switch-layer");
        line.append(el("span", `${kind} layer ${l}:`));
        const whole = el("select");
        whole.setAttribute("aria-label", `${kind} layer ${l}, every head`);
        ["(whole layer)", ...MODES].forEach((m) => whole.append(el("option", m)));
        whole.addEventListener("change", () => {
          if (whole.selectedIndex === 0) return;
          for (let h = 0; h < H; h++) setHead(kind, l, h, whole.value, false);
          whole.selectedIndex = 0;
          update(true);
        });
        for (let h = 0; h < H; h++) {
          const select = el("select");
          select.id = `switch-${kind}-${l}-${h}`;
          select.setAttribute("aria-label", `${kind} layer ${l} head ${h}`);
          MODES.forEach((m) => select.append(el("option", m)));
          select.addEventListener("change", () => setHead(kind, l, h, select.value));
          line.append(el("span", ` head ${h}`), select);
        }
        line.append(whole);
        box.append(line);
      }
    }
  }

  function syncSwitches() {
    for (const kind of KINDS) for (let l = 0; l < layersOf(kind); l++) for (let h = 0; h < H; h++) {
      const select = $(`switch-${kind}-${l}-${h}`), mode = state.off[`${kind}.${l}.${h}`] || "on";
      select.value = mode;
      select.classList.toggle("off", mode !== "on");
    }
  }

  function setHead(kind, layer, head, mode, refresh = true) {
    if (!KINDS.includes(kind)) throw new Error(`kind (${kind}) must be one of ${KINDS.join(", ")}`);
    if (!(Number.isInteger(layer) && layer >= 0 && layer < layersOf(kind))) throw new Error(`layer (${layer}) must be 0..${layersOf(kind) - 1}`);
    if (!(Number.isInteger(head) && head >= 0 && head < H)) throw new Error(`head (${head}) must be 0..${H - 1}`);
    if (!MODES.includes(mode)) throw new Error(`mode (${mode}) must be one of ${MODES.join(", ")}`);
    if (mode === "on") delete state.off[`${kind}.${layer}.${head}`];
    else state.off[`${kind}.${layer}.${head}`] = mode;
    if (refresh) update(true);
  }

  const intactExact = exactOf(DATA.held_out.predictions);
  function exactOf(predictions) {
    const targets = DATA.held_out.targets;
    const hits = predictions.filter((p, i) => p.length === targets[i].length && p.every((t, k) => t === targets[i][k])).length;
    return hits / Math.max(targets.length, 1);
  }

  const exactCache = new Map(); // state key -> held-out exact match
  let exactJob = null; // the one decoding now: { key, cancelled, promise }
  const stateKey = () => JSON.stringify(offList().sort()); // the heads off now, in one string

  /** Held-out exact match with the heads switched off now, decoded in slices so the page
   * stays responsive; a Promise of the fraction, or of null when the switches changed before
   * it was done. One job at a time: any call for another state (a cache hit too) cancels it,
   * and a call for the same state joins it. Whoever asks (the switches, or a caller of
   * window.minitfm.exactMatch()), the label shows the progress and then the number, under the
   * state it was computed for while that is still the page's. */
  function exactMatch() {
    const key = stateKey(), off = offList().length;
    if (exactJob && exactJob.key === key) return exactJob.promise;
    if (exactJob) exactJob.cancelled = true; // its number would be for an earlier state
    exactJob = null;
    if (exactCache.has(key)) return Promise.resolve(showExact(key, off, exactCache.get(key)));
    const job = { key, cancelled: false }, switched = M.switchesFor(model, MEANS, offList());
    const sources = DATA.held_out.sources, predictions = [];
    job.promise = new Promise((resolve) => {
      const slice = () => {
        if (job.cancelled) { resolve(null); return; }
        for (const end = Math.min(predictions.length + 10, sources.length); predictions.length < end;) {
          const src = sources[predictions.length];
          const decoded = M.greedyDecode(model, src, task.cap(src.length), switched).decoded;
          predictions.push(decoded[decoded.length - 1] === EOS ? decoded.slice(0, -1) : decoded);
        }
        if (key === stateKey()) $("exact").textContent = `held-out exact match: computing… ${predictions.length} of ${sources.length}`;
        if (predictions.length < sources.length) { setTimeout(slice, 0); return; }
        exactCache.set(key, exactOf(predictions));
        if (exactJob === job) exactJob = null;
        resolve(showExact(key, off, exactCache.get(key)));
      };
      setTimeout(slice, 0);
    });
    exactJob = job;
    return job.promise;
  }

  /** The label of `value`, the exact match of the state `key` (`off` heads switched off),
   * written only while that state is still the page's; `value` back. */
  function showExact(key, off, value) {
    if (key !== stateKey()) return value; // a later state shows its own
    $("exact").textContent = `held-out exact match on ${DATA.held_out.sources.length} examples: ${percent(value)}` +
      (off ? ` with ${off} head(s) switched off; intact model: ${percent(intactExact)}` : " (every head on)");
    return value;
  }

  function ablationPictures() {
    const box = $("ablation");
    if (!DATA.ablation.length) {
      box.replaceChildren(el("p", "This run has no ablation table yet: minitfm ablate RUN measures every head and layer switched off in turn, and the next explorer page shows its picture here.", "hint"));
      return;
    }
    box.className = "pictures";
    box.replaceChildren(el("h3", "The run's own ablation table (minitfm ablate)"));
    for (const picture of DATA.ablation) {
      const img = el("img");
      img.alt = `minitfm ablate picture ${picture.name}`;
      img.src = "data:image/png;base64," + picture.png.replace(/[^A-Za-z0-9+/=]/g, "");
      box.append(el("p", picture.name, "hint"), img);
    }
  }

  // --- section 4: attention over training ---

  function timeline() {
    const t = DATA.timeline, box = $("timeline");
    if (!t) { box.replaceChildren(el("p", "This run recorded no attention over training (attention.jsonl): train with log.attention_record=true, the default.", "hint")); return; }
    const slider = el("input");
    Object.assign(slider, { type: "range", min: 0, max: t.steps.length - 1, value: t.steps.length - 1, id: "training-step" });
    slider.setAttribute("aria-label", "training step");
    const label = el("span", "", "step-label");
    label.id = "training-label";
    const grid = el("div", null, "grid");
    const row = el("div", null, "timeline-row");
    row.append(slider, label);
    box.replaceChildren(el("p", `Cross-attention of one held-out example, ${t.input} → ${t.target}, as training went on (teacher-forced on its target). Drag the slider or use the arrow keys.`, "hint"), row, grid);
    const draw = () => {
      const n = Number(slider.value);
      label.textContent = `step ${t.steps[n]} · exact match ${percent(t.exact_match[n])}`;
      grid.replaceChildren();
      grid.style.gridTemplateColumns = `max-content repeat(${H}, max-content)`;
      grid.append(el("span", ""));
      for (let h = 0; h < H; h++) grid.append(el("span", `head ${h}`, "label"));
      t.cross[n].forEach((layer, l) => {
        grid.append(el("span", `layer ${l}`, "label"));
        layer.forEach((rows, h) => {
          const cell = Math.max(2, Math.floor(96 / Math.max(t.source.length, t.decoder_input.length)));
          const canvas = el("canvas");
          canvas.width = t.source.length * cell; canvas.height = rows.length * cell;
          drawCells(canvas.getContext("2d"), rows, t.source.length, cell, 0, 0);
          const figure = el("figure");
          figure.style.margin = "0";
          const score = t.alignment ? `alignment ${fixed(t.alignment[n][l][h], 2)}` : "";
          figure.append(canvas, el("figcaption", score, "label"));
          grid.append(figure);
        });
      });
    };
    slider.addEventListener("input", draw);
    draw();
  }

  // --- section 5: the run ---

  function chart(title, series, logScale) {
    const canvas = el("canvas", null, "chart");
    canvas.width = 520; canvas.height = 220;
    canvas.setAttribute("role", "img");
    canvas.setAttribute("aria-label", title);
    const ctx = canvas.getContext("2d"), pad = 44;
    const points = series.flatMap((s) => s.points).filter(([, y]) => y != null && (!logScale || y > 0));
    if (!points.length) return el("p", `${title}: no values`, "hint");
    const f = (y) => (logScale ? Math.log10(y) : y);
    const xs = points.map(([x]) => x), ys = points.map(([, y]) => f(y));
    const [x0, x1] = [Math.min(...xs), Math.max(...xs, Math.min(...xs) + 1)];
    const [y0, y1] = [Math.min(...ys), Math.max(...ys, Math.min(...ys) + 1e-9)];
    const X = (x) => pad + (x - x0) / (x1 - x0) * (canvas.width - pad - 10);
    const Y = (y) => canvas.height - 24 - (f(y) - y0) / (y1 - y0) * (canvas.height - 44);
    const fg = getComputedStyle(document.body).color;
    ctx.fillStyle = fg; ctx.font = "12px sans-serif";
    ctx.fillText(title, pad, 12);
    const label = (v) => (logScale ? (10 ** v).toPrecision(2) : v.toFixed(2));
    ctx.fillText(label(y1), 2, Y(logScale ? 10 ** y1 : y1) + 4);
    ctx.fillText(label(y0), 2, Y(logScale ? 10 ** y0 : y0));
    ctx.fillText(`step ${x0}`, pad, canvas.height - 6);
    ctx.textAlign = "right"; ctx.fillText(`step ${x1}`, canvas.width - 10, canvas.height - 6);
    series.forEach((s, k) => {
      ctx.strokeStyle = s.colour; ctx.lineWidth = 2; ctx.setLineDash(s.dash || []);
      ctx.beginPath();
      s.points.filter(([, y]) => y != null && (!logScale || y > 0)).forEach(([x, y], i) => (i ? ctx.lineTo(X(x), Y(y)) : ctx.moveTo(X(x), Y(y))));
      ctx.stroke();
      ctx.fillStyle = s.colour; ctx.textAlign = "right"; ctx.fillText(s.name, canvas.width - 10, 28 + 14 * k);
    });
    return canvas;
  }

  // The gauges (minitfm/lab/watch/gauges.py), read while the run trained: what moved before
  // exact match did, and the forecast made from them at each reading.
  function gauges(readings, box) {
    if (!readings.length) { box.append(el("p", "No gauge readings in metrics.jsonl: train with log.gauge_every above 0 (the default, 10).", "hint")); return; }
    const series = [{ name: "exact (teacher-forced)", colour: "#009e73", points: readings.map(([s, e]) => [s, e]) },
      { name: "token accuracy", colour: "#0072b2", dash: [5, 3], points: readings.map(([s, , a]) => [s, a]) }];
    if (readings.some(([, , , align]) => align != null)) series.push({ name: "alignment", colour: "#cc79a7", dash: [2, 2], points: readings.map(([s, , , align]) => [s, align]) });
    box.append(chart("the gauges, read while training (teacher-forced on 200 held-out pairs)", series, false));
    const said = readings.filter(([, , , , text]) => text);
    if (said.length) {
      const list = el("ul", null, "forecasts");
      list.id = "forecasts";
      said.forEach(([s, , , , text]) => list.append(el("li", `step ${s}: ${text}`)));
      box.append(el("p", "What the forecast said at each reading:", "hint"), list);
    }
  }

  function runFacts() {
    const c = DATA.curves, box = $("curves");
    if (c) {
      box.replaceChildren(
        chart("loss (log scale)", [{ name: "training", colour: "#0072b2", points: c.train },
          { name: "held-out", colour: "#d55e00", dash: [5, 3], points: c.eval.map(([s, l]) => [s, l]) }], true),
        chart("held-out exact match", [{ name: "exact match", colour: "#009e73", points: c.eval.map(([s, , e]) => [s, e]) }], false));
      gauges(c.gauges || [], box);
    } else box.replaceChildren(el("p", "No metrics.jsonl: a checkpoint outside a run directory.", "hint"));
    const per = DATA.per_length, perBox = $("per-length");
    if (per) {
      const table = el("table");
      table.append(el("caption", `exact match per input length (${per.file})`));
      const head = el("tr");
      ["length", "count", "exact match"].forEach((t) => head.append(el("th", t)));
      table.append(head);
      Object.entries(per.per_length).sort((a, b) => a[0] - b[0]).forEach(([n, [exact, count]]) => {
        const tr = el("tr");
        tr.append(el("td", n, "num"), el("td", count, "num"), el("td", percent(exact), "num"));
        table.append(tr);
      });
      perBox.replaceChildren(table);
    } else perBox.replaceChildren(el("p", "No per-length evaluation saved in this run (minitfm sweep saves eval-A-B.json; minitfm eval prints one).", "hint"));
    const m = DATA.meta, facts = $("facts");
    const params = Object.values(DATA.model.index).reduce((n, [, shape]) => n + shape.reduce((a, b) => a * b, 1), 0);
    facts.replaceChildren();
    [["task", m.task], ["run", m.run || "(a checkpoint outside a run)"], ["checkpoint", `${m.checkpoint} · step ${m.step}`],
     ["seed", m.seed], ["parameters", params.toLocaleString("en")], ["minitfm", m.version],
     ["checkpoint saved", m.saved], ["page written", m.written],
     ["head means", `over ${DATA.mean_samples} held-out pairs, as minitfm ablate`]].forEach(([k, v]) => facts.append(el("dt", k), el("dd", v)));
    $("config").textContent = JSON.stringify(DATA.config, null, 2);
  }

  // --- the address: input, selected map and switched-off heads ---

  function writeHash() {
    const params = new URLSearchParams();
    params.set("input", state.input);
    params.set("kind", state.kind); params.set("layer", state.layer); params.set("head", state.head);
    const off = Object.entries(state.off).map(([k, m]) => `${k}.${m}`).join(",");
    if (off) params.set("off", off);
    history.replaceState(null, "", "#" + params.toString());
  }

  function readHash() {
    const params = new URLSearchParams(location.hash.slice(1));
    if (params.has("input")) state.input = params.get("input");
    const kind = params.get("kind"), layer = Number(params.get("layer")), head = Number(params.get("head"));
    if (KINDS.includes(kind) && Number.isInteger(layer) && layer >= 0 && layer < layersOf(kind) &&
        Number.isInteger(head) && head >= 0 && head < H) Object.assign(state, { kind, layer, head });
    state.off = {};
    for (const item of (params.get("off") || "").split(",").filter(Boolean)) {
      const [k, l, h, mode] = item.split(".");
      try { setHead(k, Number(l), Number(h), mode, false); } catch (err) { /* a hand-edited address: ignore the item */ }
    }
  }

  // --- putting it together ---

  function update(headsChanged) {
    shown = predict(state.input);
    showDecoding(shown);
    showMaps(shown);
    inside.lensTable($("lens-table"), shown);
    syncSwitches();
    writeHash();
    if (headsChanged) exactMatch(); // its label follows
  }

  function start() {
    const m = DATA.meta;
    $("title").textContent = `· ${m.task} · ${m.run || m.checkpoint} · step ${m.step}`;
    const [lo, hi] = DATA.task.trained_lengths;
    $("input-hint").textContent = `(task ${DATA.task.name}: ${DATA.task.allowed}; e.g. ${DATA.task.example}; trained on lengths ${lo}..${hi}; at most ${DATA.task.max_tokens} tokens)`;
    state.input = DATA.timeline ? DATA.timeline.input : DATA.task.example;
    switches(); legend(); alignmentTable(); ablationPictures(); timeline(); runFacts(); zoomEvents();
    readHash();
    $("input").value = state.input;
    inside.roleCards($("role-cards"));
    patchView = inside.patchView(state.input);
    $("input").addEventListener("input", () => { state.input = $("input").value; zoom.at = [0, 0]; update(false); });
    $("all-on").addEventListener("click", () => { state.off = {}; update(true); });
    window.addEventListener("hashchange", () => { readHash(); $("input").value = state.input; update(true); });
    update(true);
    patchView.run(state.input, ""); // the input of section 1 and its default corruption
  }

  window.minitfm = {
    predict, exactMatch, state, data: DATA,
    patch: (clean, corrupt) => patchView.run(clean, corrupt), // a Promise of the result
    setHead: (kind, layer, head, mode) => setHead(kind, layer, head, mode, true),
  };
  start();
})();
