/* Activation patching and the logit lens in JavaScript: lab/interpret/patching.py and lens.py, on
 * model.js's hook points, for one clean and one corrupted input
 * (tests/lab/explore/test_explore.py holds them to Python's figures).
 *
 * Patching: both runs are teacher-forced on BOS + the clean answer (the model's greedy output
 * for the clean input), so they differ only in their source. At each output position t where
 * the corrupted answer differs, LD_t = z_t[clean token] - z_t[corrupted token], summed. Patching
 * one activation reruns the corrupted input with that activation taken from the clean run; its
 * restored share is (LD_patched - LD_corrupted) / (LD_clean - LD_corrupted): 0 when it changes
 * nothing, 1 when it brings the clean preference back on its own. The activations: each head's
 * output before W^O (at every position at once), and the residual stream at one position (the
 * input of each encoder layer, the memory, the output of each decoder layer).
 *
 * The logit lens: each decoder layer's output at each step, through what the model applies
 * after its last layer (model.js readOut: the final layer norm of a pre-LN model, then the
 * output projection), as if that layer were the last.
 *
 * Shapes: S source len, T decoder len, D d_model, H n_heads, K d_head, V vocab size.
 */
(function (root) {
  "use strict";

  const M = root.minitfmModel, T = root.minitfmTask;
  const FIRST_SYMBOL = 3; // ids 0..2 are <pad>, <bos>, <eos> (catalog.SPECIAL_TOKENS)

  /** The model's greedy answer to `src`, without EOS (as book.metrics.predict gives it). */
  function answerOf(model, task, src) {
    const decoded = M.greedyDecode(model, src, task.cap(src.length)).decoded;
    return decoded[decoded.length - 1] === model.spec.eos_id ? decoded.slice(0, -1) : decoded;
  }

  const same = (a, b) => a.length === b.length && a.every((t, i) => t === b[i]);

  /** One teacher-forced pass: the decoder reads `tgtIn` (T,) -> logits, T x (V,). The KV
   * cache gives each step what a causal mask would: the tokens up to it. `memory` (S, D), when
   * given, is the encoder's output for `src` (a patch after the encoder leaves it as it is). */
  function teacherForced(model, src, tgtIn, hooks, memory) {
    const switches = { ...M.noSwitches(model), hooks: hooks || null };
    memory = memory || M.encode(model, src, switches).memory;
    const cache = M.newCache(model, memory);
    return tgtIn.map((token, t) => M.decodeStep(model, token, t, cache, switches).logits);
  }

  // --- one clean and one corrupted input ---

  /** patching.contrast for one pair: the answers (EOS written), the decoder input (BOS + the
   * clean answer) and the scored positions [t, clean token, corrupted token]; `error` (and no
   * scored positions) when both answers are the same. */
  function contrast(model, task, clean, corrupt) {
    const EOS = model.spec.eos_id;
    const ours = [...answerOf(model, task, clean), EOS], theirs = [...answerOf(model, task, corrupt), EOS];
    const scored = [];
    for (let t = 0; t < Math.min(ours.length, theirs.length); t++) {
      if (ours[t] !== theirs[t]) scored.push([t, ours[t], theirs[t]]);
    }
    return { clean, corrupt, cleanAnswer: ours, corruptAnswer: theirs, scored,
             decoderInput: [model.spec.bos_id, ...ours.slice(0, -1)],
             error: scored.length ? null : "the clean and the corrupted input get the same answer, so there is nothing to restore: give a corrupted input whose answer differs" };
  }

  /** LD summed over the scored positions: logits T x (V,). */
  function logitDiff(batch, logits) {
    return batch.scored.reduce((sum, [t, c, k]) => sum + logits[t][c] - logits[t][k], 0);
  }

  /** The clean run's logits, every head's output "kind.layer" -> H x T_q x (K,) and the
   * residual stream at every point "stream.layer" -> T x (D,). */
  function recorded(model, batch) {
    const heads = {}, stream = {};
    const hooks = {
      heads(kind, layer, outs, qPos) {
        const rows = heads[`${kind}.${layer}`] || (heads[`${kind}.${layer}`] = outs.map(() => []));
        outs.forEach((out, h) => out.forEach((row, i) => { rows[h][qPos[i]] = row; }));
        return outs;
      },
      residual(name, layer, x, pos) {
        const rows = stream[`${name}.${layer}`] || (stream[`${name}.${layer}`] = []);
        x.forEach((row, i) => { rows[pos[i]] = row; });
        return x;
      },
    };
    return { logits: teacherForced(model, batch.clean, batch.decoderInput, hooks), heads, stream };
  }

  /** Every activation to patch, in patching.py's order: the heads (kind by kind, layer by
   * layer), then the residual points (the input of each encoder layer, the memory, the output
   * of each decoder layer), position by position. */
  function activations(model) {
    const { n_encoder_layers: E, n_decoder_layers: L, n_heads: H } = model.cfg;
    const list = [];
    for (const kind of ["encoder", "decoder", "cross"]) {
      for (let layer = 0; layer < (kind === "encoder" ? E : L); layer++) {
        for (let head = 0; head < H; head++) list.push({ kind, layer, head });
      }
    }
    const points = [...Array.from({ length: E + 1 }, (_, l) => ["encoder", l]),
                    ...Array.from({ length: L }, (_, l) => ["decoder", l])];
    return { heads: list, points };
  }

  /** The hooks that patch one activation from the clean run `clean` (see `recorded`). */
  function patchHooks(clean, what) {
    if (what.kind) {
      const rows = clean.heads[`${what.kind}.${what.layer}`][what.head];
      return { heads: (kind, layer, outs, qPos) => (kind === what.kind && layer === what.layer
        ? outs.map((out, h) => (h === what.head ? qPos.map((p) => rows[p]) : out)) : outs) };
    }
    const rows = clean.stream[`${what.stream}.${what.layer}`];
    return { residual: (name, layer, x, pos) => (name === what.stream && layer === what.layer
      ? x.map((row, i) => (pos[i] === what.position ? rows[what.position] : row)) : x) };
  }

  /** patching.patch_activations for one pair, as work in pieces: `cleanDiff`, `corruptDiff`,
   * and `jobs`, each a function that patches one activation and returns its row ({kind, layer,
   * head} or {stream, layer, position}, with `logit_diff` and `restored`). The page runs them a
   * few at a time; `patchActivations` runs them all. */
  function patching(model, batch) {
    const clean = recorded(model, batch);
    const cleanDiff = logitDiff(batch, clean.logits);
    const memory = M.encode(model, batch.corrupt, M.noSwitches(model)).memory; // (S, D)
    const corruptDiff = logitDiff(batch, teacherForced(model, batch.corrupt, batch.decoderInput, null, memory));
    const span = cleanDiff - corruptDiff;
    const { heads, points } = activations(model);
    const job = (what) => () => { // a patch in the decoder leaves the corrupted memory as it is
      const after = what.kind ? what.kind !== "encoder" : what.stream === "decoder";
      const logits = teacherForced(model, batch.corrupt, batch.decoderInput, patchHooks(clean, what),
                                   after ? memory : null);
      const diff = logitDiff(batch, logits);
      return { ...what, logit_diff: diff, restored: span ? (diff - corruptDiff) / span : 0 };
    };
    const positions = points.map(([name, layer]) => [name, layer, clean.stream[`${name}.${layer}`].length]);
    const jobs = [...heads.map(job), ...positions.flatMap(([stream, layer, n]) =>
      Array.from({ length: n }, (_, position) => job({ stream, layer, position })))];
    return { cleanDiff, corruptDiff, jobs, headCount: heads.length };
  }

  /** Every job of `patching` at once: {cleanDiff, corruptDiff, heads, residual}. */
  function patchActivations(model, batch) {
    const work = patching(model, batch), rows = work.jobs.map((job) => job());
    return { cleanDiff: work.cleanDiff, corruptDiff: work.corruptDiff,
             heads: rows.slice(0, work.headCount), residual: rows.slice(work.headCount) };
  }

  /** Whether `src` is an input the task takes, as patching.accepts: its text parses. */
  function accepts(task, src) {
    try {
      task.parse(task.formatLike(src, ""));
      return true;
    } catch (err) {
      if (err instanceof T.TaskInputError) return false;
      throw err;
    }
  }

  /** The single-token changes of `src` that the task accepts, in patching.corruption's order:
   * by position, then by symbol. */
  function* candidates(task, src) {
    for (let position = 0; position < src.length; position++) {
      for (let symbol = FIRST_SYMBOL; symbol < task.spec.tokens.length; symbol++) {
        if (symbol === src[position]) continue;
        const candidate = src.slice();
        candidate[position] = symbol;
        if (accepts(task, candidate)) yield candidate;
      }
    }
  }

  /** patching.corruption: the first of the `candidates` that changes the model's answer; null
   * when none does. (The page goes through them a few at a time: see inside.js.) */
  function corruption(model, task, src) {
    const answer = answerOf(model, task, src);
    for (const candidate of candidates(task, src)) {
      if (!same(answerOf(model, task, candidate), answer)) return candidate;
    }
    return null;
  }

  // --- the logit lens ---

  /** Hooks that keep each decoder layer's output at each step: outputs[layer][step] (D,). */
  function decoderOutputs(outputs) {
    return { residual(name, layer, x, pos) {
      if (name === "decoder") (outputs[layer] || (outputs[layer] = []))[pos[0]] = x[0];
      return x;
    } };
  }

  /** Per layer and step: the token its output would write {token, p}, and `p_written`, the
   * probability of the token the model wrote there (`written`, EOS included). */
  function lensOf(model, outputs, written) {
    return outputs.map((steps) => M.readOut(model, steps).map((logits, t) => {
      const probs = M.softmax(Array.from(logits)), top = M.argmax(logits).token;
      return { token: top, p: probs[top], p_written: probs[written[t]] };
    }));
  }

  /** lens.logit_lens: the lens of `src`, teacher-forced on BOS + `answer` (the model's greedy
   * answer without EOS, computed when not given); the model writes answer + EOS. */
  function logitLens(model, task, src, answer) {
    answer = answer || answerOf(model, task, src);
    const written = [...answer, model.spec.eos_id], outputs = [];
    teacherForced(model, src, [model.spec.bos_id, ...answer], decoderOutputs(outputs));
    return { src, written, layers: lensOf(model, outputs, written) };
  }

  /** The same lens from a greedy decoding that kept its decoder outputs (`decoderOutputs`):
   * each step of it is the teacher-forced step, so nothing runs again, unless the decoding
   * stopped at its cap before EOS (then the step that would write EOS is run, as Python's). */
  function lensOfDecoding(model, task, src, decoded, outputs) {
    if (decoded[decoded.length - 1] !== model.spec.eos_id) return logitLens(model, task, src, decoded);
    return { src, written: decoded, layers: lensOf(model, outputs, decoded) };
  }

  root.minitfmPatching = {
    answerOf, teacherForced, contrast, logitDiff, recorded, patching, patchActivations,
    accepts, candidates, corruption, same, decoderOutputs, lensOf, logitLens, lensOfDecoding,
  };
})(typeof window !== "undefined" ? window : globalThis);
