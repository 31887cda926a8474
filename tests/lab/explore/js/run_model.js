// Runs the page's model in Node for tests/lab/explore/test_explore.py:
// node run_model.js DATA.json INPUTS.json
// prints, per input, what the page computes: output, decoded ids, logits, attention maps; or,
// for {patch: [clean, corrupt]}, {corruption: text} and {lens: text}, what patching.js gives.
"use strict";
const fs = require("fs");
const path = require("path");
const dir = process.env.MINITFM_EXPLORE_DIR;
for (const name of ["task.js", "model.js", "patching.js"]) {
  require(path.resolve(dir, name)); // each sets globalThis.minitfmTask / minitfmModel / ...
}
const data = JSON.parse(fs.readFileSync(process.argv[2], "utf-8"));
const inputs = JSON.parse(fs.readFileSync(process.argv[3], "utf-8"));
const M = globalThis.minitfmModel, T = globalThis.minitfmTask, P = globalThis.minitfmPatching;
const model = data.model ? M.makeModel(data.model, M.loadWeights(data.model.weights, data.model.index)) : null;
const task = T.makeTask(data.task);
const means = Object.fromEntries(Object.entries(data.means || {}).map(([k, v]) => [k, M.decodeFloats(v)]));
const results = inputs.map((item) => {
  if (item.held_out) { // every embedded held-out source, decoded (EOS stripped)
    const switches = M.switchesFor(model, means, item.heads_off || []);
    return data.held_out.sources.map((src) => {
      const decoded = M.greedyDecode(model, src, task.cap(src.length), switches).decoded;
      return decoded[decoded.length - 1] === 2 ? decoded.slice(0, -1) : decoded;
    });
  }
  if (item.patch) { // patching.patch_activations of two typed inputs
    const [clean, corrupt] = item.patch.map((text) => task.parseInput(text).src);
    const batch = P.contrast(model, task, clean, corrupt);
    if (batch.error) return { error: batch.error };
    return { scored: batch.scored, ...P.patchActivations(model, batch) };
  }
  if (item.exact) { // patching a whole point at every position: the clean run, exactly
    const [clean, corrupt] = item.exact.map((text) => task.parseInput(text).src);
    const batch = P.contrast(model, task, clean, corrupt), record = P.recorded(model, batch);
    const run = (hooks) => P.teacherForced(model, corrupt, batch.decoderInput, hooks);
    const gap = (a, b) => Math.max(...a.map((row, t) => Math.max(...row.map((v, i) => Math.abs(v - b[t][i])))));
    const whole = (stream, layer) => ({ residual: (name, l, x, pos) =>
      (name === stream && l === layer ? pos.map((p) => record.stream[`${name}.${l}`][p]) : x) });
    const last = ["decoder", model.cfg.n_decoder_layers - 1]; // the output of the last layer
    return { memory: gap(run(whole("encoder", model.cfg.n_encoder_layers)), record.logits),
             last: gap(run(whole(...last)), record.logits),
             nothing: gap(run({ residual: (name, l, x) => x }), run(null)) };
  }
  if (item.corruption != null) return { corrupt: P.corruption(model, task, task.parseInput(item.corruption).src) };
  if (item.lens != null) return P.logitLens(model, task, task.parseInput(item.lens).src);
  if (item.lens_of_decoding != null) { // the page's way: from the decoder outputs its decoding kept
    const src = task.parseInput(item.lens_of_decoding).src, outputs = [];
    const switches = { ...M.noSwitches(model), hooks: P.decoderOutputs(outputs) };
    const decoded = M.greedyDecode(model, src, task.cap(src.length), switches).decoded;
    return P.lensOfDecoding(model, task, src, decoded, outputs);
  }
  const read = task.parseInput(item.text);
  if (read.error || !model) return read; // {error} or, reading only, {src}
  const switches = M.switchesFor(model, means, item.heads_off || []);
  const run = M.greedyDecode(model, read.src, task.cap(read.src.length), switches);
  const out = run.decoded[run.decoded.length - 1] === 2 ? run.decoded.slice(0, -1) : run.decoded;
  return { src: read.src, decoded: run.decoded, output: task.formatLike(out, item.text),
           logits: run.steps.map((s) => Array.from(s.logits)),
           near_ties: run.steps.map((s) => s.nearTie),
           maps: run.maps, cap: task.cap(read.src.length) };
});
process.stdout.write(JSON.stringify(results));
