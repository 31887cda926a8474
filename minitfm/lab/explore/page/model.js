/* minitfm's model in JavaScript: the forward pass of book/model.py's Seq2SeqTransformer and
 * its greedy decoding, written as the book writes them, for one input at a time.
 *
 * Shapes: S source len, T decoded tokens so far, D d_model, H n_heads, K d_head (= D / H),
 * F d_ff, V vocab_size. A matrix (T, D) is an array of T rows, each a Float64Array(D).
 * Weights are float32 (as PyTorch keeps them), sums are float64: the answers agree with
 * PyTorch's to about 1e-6 (tests/lab/explore/test_explore.py measures it).
 *
 * One input at a time means no padding, so no attention here needs a mask: the encoder and
 * cross-attention see every source token, and a decoding step's query sees every token
 * decoded so far (the causal mask hides only later tokens, and there are none yet).
 *
 * Hook points, as lab/interpret/patching.py names them: `switches.hooks` may hold functions that
 * see an activation and return the one the model goes on with (patching.js records and
 * patches through them; the page's predictions use none):
 *   heads(kind, layer, outs, qPos): every head's output before W^O, H x (T_q, K), for the
 *     queries at positions qPos (a decoding step: one query);
 *   residual(stream, layer, x, pos): the residual stream (T, D) at positions pos: ("encoder", l)
 *     the input of encoder layer l, ("encoder", n_encoder_layers) the memory, ("decoder", l)
 *     the output of decoder layer l (patching.py's names: "encoder in Ll", "memory",
 *     "decoder out Ll").
 */
(function (root) {
  "use strict";

  const LN_EPS = 1e-5; // book/layers.py LayerNorm's ε
  const NEAR_TIE = 1e-4; // logits closer than this may be ordered otherwise in float32

  // --- the weights, embedded as base64 float32 ---

  /** One base64 string of little-endian float32 -> Float32Array. */
  function decodeFloats(base64) {
    const text = atob(base64);
    const bytes = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
    return new Float32Array(bytes.buffer);
  }

  /** The state dict: name -> {shape, data (a view of the one blob)}. */
  function loadWeights(blob, index) {
    const all = decodeFloats(blob);
    const weights = {};
    for (const [name, [offset, shape]] of Object.entries(index)) {
      const size = shape.reduce((a, b) => a * b, 1);
      weights[name] = { shape, data: all.subarray(offset, offset + size) };
    }
    return weights;
  }

  // --- the layers (book/layers.py) ---

  /** x (T, in) -> x W^T + b (T, out); weight (out, in) as nn.Linear stores it, bias (out,). */
  function linear(x, weight, bias) {
    const [nOut, nIn] = weight.shape;
    const W = weight.data, b = bias ? bias.data : null;
    return x.map((row) => {
      const y = new Float64Array(nOut);
      for (let o = 0; o < nOut; o++) {
        let sum = b ? b[o] : 0;
        const start = o * nIn;
        for (let i = 0; i < nIn; i++) sum += W[start + i] * row[i];
        y[o] = sum;
      }
      return y; // (out,)
    });
  }

  /** Layer norm (Ba et al. 2016): γ (x - mean) / sqrt(s² + ε) + δ per row of x (T, D). */
  function layerNorm(x, norm) {
    const gamma = norm.weight.data, delta = norm.bias.data;
    return x.map((row) => {
      const D = row.length;
      let mean = 0;
      for (let i = 0; i < D; i++) mean += row[i];
      mean /= D;
      let variance = 0; // the biased variance s²
      for (let i = 0; i < D; i++) variance += (row[i] - mean) ** 2;
      const rstd = 1 / Math.sqrt(variance / D + LN_EPS);
      const y = new Float64Array(D);
      for (let i = 0; i < D; i++) y[i] = gamma[i] * (row[i] - mean) * rstd + delta[i];
      return y; // (D,)
    });
  }

  /** Position-wise feed-forward (Vaswani §3.3): Linear, ReLU, Linear: (T, D) -> (T, F) -> (T, D). */
  function feedForward(x, ff) {
    const hidden = linear(x, ff.linear1.weight, ff.linear1.bias); // (T, F)
    for (const row of hidden) for (let i = 0; i < row.length; i++) row[i] = Math.max(row[i], 0);
    return linear(hidden, ff.linear2.weight, ff.linear2.bias); // (T, D)
  }

  function add(x, y) { // x + y, (T, D)
    return x.map((row, t) => row.map((v, i) => v + y[t][i]));
  }

  // --- positions (book/positions.py) ---
  // The angles p θ_i are float32 products in PyTorch: Math.fround rounds them the same way.

  /** The sinusoid PE(pos) (D,): sin at even features, cos at odd ones (Vaswani §3.5). */
  function sinusoid(pos, invFreq, D) {
    const pe = new Float64Array(D);
    for (let i = 0; i < D; i++) {
      const angle = Math.fround(pos * invFreq[i >> 1]);
      pe[i] = i % 2 === 0 ? Math.sin(angle) : Math.cos(angle);
    }
    return pe;
  }

  /** RoPE (Su et al. 2021): turn each pair (x_2i, x_2i+1) of x (K,) by the angle pos θ_i. */
  function rotate(x, pos, invFreq) {
    const y = new Float64Array(x.length);
    for (let i = 0; i < x.length / 2; i++) {
      const angle = Math.fround(pos * invFreq[i]);
      const cos = Math.cos(angle), sin = Math.sin(angle);
      const even = x[2 * i], odd = x[2 * i + 1];
      y[2 * i] = even * cos - odd * sin;
      y[2 * i + 1] = even * sin + odd * cos;
    }
    return y;
  }

  /** ALiBi (Press et al. 2022): head h's bias -m_h |i - j| for query i and key j. */
  function alibiBias(slopes, h, i, j) {
    return Math.fround(-slopes[h] * Math.abs(i - j));
  }

  // --- attention (book/attention.py) ---

  /** softmax of one row of scores: exp(s - max s) / Σ exp(s - max s). */
  function softmax(scores) {
    const max = Math.max(...scores);
    const e = scores.map((s) => Math.exp(s - max));
    const total = e.reduce((a, b) => a + b, 0);
    return e.map((v) => v / total);
  }

  /** softmax(Q K^T / sqrt(K) + bias) V (Vaswani §3.2.1) for one head: q (T_q, K),
   * k and v (T_k, K), bias(i, j) or null -> output (T_q, K), weights (T_q, T_k). */
  function scaledDotProductAttention(q, k, v, bias) {
    const K = q[0].length, scale = K ** -0.5;
    const weights = q.map((query, i) => softmax(k.map((key, j) => {
      let score = 0;
      for (let c = 0; c < K; c++) score += query[c] * scale * key[c];
      return bias ? score + bias(i, j) : score;
    }))); // (T_q, T_k), each row a distribution over the keys
    const out = weights.map((row) => {
      const o = new Float64Array(K);
      row.forEach((w, j) => { for (let c = 0; c < K; c++) o[c] += w * v[j][c]; });
      return o;
    }); // (T_q, K)
    return { out, weights };
  }

  /** (T, D) -> H matrices (T, K): head h reads the features h*K .. (h+1)*K - 1. */
  function splitHeads(x, H) {
    const K = x[0].length / H;
    return Array.from({ length: H }, (_, h) => x.map((row) => row.slice(h * K, (h + 1) * K)));
  }

  /** Multi-head attention (Vaswani §3.2.2): query (T_q, D) attends to keys and values; returns
   * output (T_q, D) and weights (H, T_q, T_k).
   *
   * `kv` holds the projected keys and values, per head (T_k, K), with their positions:
   * `projectKV` makes them (and a decoding step appends to them: the KV cache). `scope` says
   * what positions do here: the query positions, RoPE's θ, ALiBi's slopes, and the hook point
   * `heads` of this layer (or null). `switched` (H,) holds, per head, null (on) or the vector
   * (K,) a switched-off head outputs instead (lab/interpret/ablate.py: 0, or its mean over held-out
   * data), before W^O, as `minitfm ablate` does.
   */
  function multiHeadAttention(mha, query, kv, scope, switched) {
    const H = kv.k.length;
    let q = splitHeads(linear(query, mha.q_proj.weight, mha.q_proj.bias), H); // H x (T_q, K)
    if (scope.invFreq) q = q.map((head) => head.map((row, i) => rotate(row, scope.qPos[i], scope.invFreq)));
    const weights = [];
    let outs = [];
    for (let h = 0; h < H; h++) {
      const bias = scope.slopes
        ? (i, j) => alibiBias(scope.slopes, h, scope.qPos[i], kv.pos[j]) : null;
      const { out, weights: w } = scaledDotProductAttention(q[h], kv.k[h], kv.v[h], bias);
      weights.push(w); // (T_q, T_k)
      const value = switched ? switched[h] : null; // the hook point `heads`
      outs.push(value ? out.map(() => Float64Array.from(value)) : out); // (T_q, K)
    }
    if (scope.heads) outs = scope.heads(outs, scope.qPos); // H x (T_q, K), seen or replaced
    const concat = query.map((_, t) => {
      const row = new Float64Array(query[0].length); // (D,): the heads side by side
      outs.forEach((out, h) => row.set(out[t], h * out[t].length));
      return row;
    });
    return { out: linear(concat, mha.out_proj.weight, mha.out_proj.bias), weights };
  }

  /** Keys and values of x (T, D) at positions `pos`, per head (T, K), keys turned by RoPE. */
  function projectKV(mha, x, pos, H, invFreq) {
    let k = splitHeads(linear(x, mha.k_proj.weight, mha.k_proj.bias), H);
    const v = splitHeads(linear(x, mha.v_proj.weight, mha.v_proj.bias), H);
    if (invFreq) k = k.map((head) => head.map((row, j) => rotate(row, pos[j], invFreq)));
    return { k, v, pos: pos.slice() };
  }

  /** Append this step's keys and values (per head (1, K)) to a cache `kv`. */
  function appendKV(kv, fresh) {
    fresh.k.forEach((head, h) => kv.k[h].push(...head));
    fresh.v.forEach((head, h) => kv.v[h].push(...head));
    kv.pos.push(...fresh.pos);
  }

  // --- the model (book/model.py) ---

  /** The model: its config, its weights grouped like the modules, what positions need. */
  function makeModel(spec, weights) {
    const get = (prefix) => new Proxy({}, { // encoder_layers.0.self_attn.q_proj.weight
      get: (_, name) => weights[`${prefix}.${name}`] || get(`${prefix}.${name}`),
    });
    const cfg = spec.config;
    return {
      cfg, spec, p: get("model"),
      embedding: weights["model.embedding.weight"],
      generator: weights["model.generator.weight"] || weights["model.embedding.weight"],
      invFreq: spec.inv_freq ? Float32Array.from(spec.inv_freq) : null,
      slopes: spec.slopes ? Float32Array.from(spec.slopes) : null,
    };
  }

  /** Tokens -> embeddings times sqrt(D) (§3.4), plus positions offset.. (sinusoidal, learned). */
  function embed(model, tokens, offset) {
    const { d_model: D, positional } = model.cfg;
    const E = model.embedding.data, scale = Math.sqrt(D);
    return tokens.map((token, t) => {
      const x = new Float64Array(D);
      for (let i = 0; i < D; i++) x[i] = E[token * D + i] * scale;
      const pos = offset + t;
      if (positional === "sinusoidal") {
        const pe = sinusoid(pos, model.invFreq, D);
        for (let i = 0; i < D; i++) x[i] += pe[i];
      } else if (positional === "learned") {
        const P = model.p.positional.weight.data;
        for (let i = 0; i < D; i++) x[i] += P[pos * D + i];
      }
      return x; // (D,)
    });
  }

  /** What positions do inside attention for queries at `qPos`: RoPE's θ, ALiBi's slopes; and
   * the hook point `heads` of attention (kind, layer), when `switches.hooks` has one. */
  function scopeOf(model, qPos, switches, kind, layer) {
    const positional = model.cfg.positional, hook = switches && switches.hooks && switches.hooks.heads;
    return { qPos, invFreq: positional === "rope" ? model.invFreq : null,
             slopes: positional === "alibi" ? model.slopes : null,
             heads: hook ? (outs, pos) => hook(kind, layer, outs, pos) : null };
  }

  /** The hook point `residual` at (stream, layer): x (T, D) at positions pos, or what the hook
   * gives back. */
  function residualHook(switches, stream, layer, x, pos) {
    const hook = switches.hooks && switches.hooks.residual;
    return hook ? hook(stream, layer, x, pos) : x;
  }

  /** Pre-LN x + Sublayer(LN(x)), or post-LN LN(x + Sublayer(x)), for one sub-layer. */
  function residual(model, x, norm, sublayer) {
    if (model.cfg.norm_first) return add(x, sublayer(layerNorm(x, norm)));
    return layerNorm(add(x, sublayer(x)), norm);
  }

  /** Encoder layer l: self-attention then feed-forward: x (S, D) -> x (S, D), weights
   * (H, S, S). */
  function encoderLayer(model, l, x, pos, switches) {
    const H = model.cfg.n_heads, scope = scopeOf(model, pos, switches, "encoder", l);
    const layer = model.p.encoder_layers[l];
    let weights;
    x = residual(model, x, layer.norm1, (h) => {
      const kv = projectKV(layer.self_attn, h, pos, H, scope.invFreq);
      const result = multiHeadAttention(layer.self_attn, h, kv, scope, switches.encoder[l]);
      weights = result.weights;
      return result.out;
    });
    x = residual(model, x, layer.norm2, (h) => feedForward(h, layer.feed_forward));
    return { x, weights };
  }

  /** The source (S,) -> memory (S, D) and the encoder's weights per layer (H, S, S). */
  function encode(model, src, switches) {
    const pos = src.map((_, i) => i);
    let x = embed(model, src, 0);
    const maps = [];
    const E = model.cfg.n_encoder_layers;
    for (let l = 0; l < E; l++) {
      x = residualHook(switches, "encoder", l, x, pos); // the input of layer l
      const result = encoderLayer(model, l, x, pos, switches);
      x = result.x;
      maps.push(result.weights);
    }
    const memory = residualHook(switches, "encoder", E,
                                model.cfg.norm_first ? layerNorm(x, model.p.encoder_norm) : x, pos);
    return { memory, maps };
  }

  /** Empty KV caches, one per decoder layer: self-attention grows, cross-attention is the
   * memory's keys and values, projected once. */
  function newCache(model, memory) {
    const H = model.cfg.n_heads, pos = memory.map((_, j) => j);
    const invFreq = model.cfg.positional === "rope" ? model.invFreq : null;
    return Array.from({ length: model.cfg.n_decoder_layers }, (_, l) => {
      const layer = model.p.decoder_layers[l];
      return { self: { k: Array.from({ length: H }, () => []), v: Array.from({ length: H }, () => []), pos: [] },
               cross: projectKV(layer.cross_attn, memory, pos, H, invFreq) };
    });
  }

  /** Decoder layer l: causal self-attention, cross-attention, feed-forward, for the one token
   * at position t: x (1, D) -> x (1, D), self weights (H, 1, t + 1), cross weights (H, 1, S). */
  function decoderLayer(model, l, x, t, cache, switches) {
    const H = model.cfg.n_heads, layer = model.p.decoder_layers[l];
    const selfScope = scopeOf(model, [t], switches, "decoder", l);
    const crossScope = scopeOf(model, [t], switches, "cross", l);
    let selfWeights, crossWeights;
    x = residual(model, x, layer.norm1, (h) => {
      appendKV(cache.self, projectKV(layer.self_attn, h, [t], H, selfScope.invFreq));
      const result = multiHeadAttention(layer.self_attn, h, cache.self, selfScope, switches.decoder[l]);
      selfWeights = result.weights;
      return result.out;
    });
    x = residual(model, x, layer.norm2, (h) => {
      const result = multiHeadAttention(layer.cross_attn, h, cache.cross, crossScope, switches.cross[l]);
      crossWeights = result.weights;
      return result.out;
    });
    x = residual(model, x, layer.norm3, (h) => feedForward(h, layer.feed_forward));
    return { x, selfWeights, crossWeights };
  }

  /** One decoding step: the token at position t (after those in `cache`) -> logits (V,),
   * and per layer the weights of its query row: self (H, t + 1), cross (H, S). */
  function decodeStep(model, token, t, cache, switches) {
    let x = embed(model, [token], t); // (1, D)
    const selfRows = [], crossRows = [];
    for (let l = 0; l < model.cfg.n_decoder_layers; l++) {
      const r = decoderLayer(model, l, x, t, cache[l], switches);
      x = residualHook(switches, "decoder", l, r.x, [t]); // the output of layer l
      selfRows.push(r.selfWeights.map((w) => w[0]));
      crossRows.push(r.crossWeights.map((w) => w[0]));
    }
    return { logits: readOut(model, x)[0], selfRows, crossRows }; // logits (V,)
  }

  /** What the model applies after its last decoder layer: the final layer norm of a pre-LN
   * model (nothing for post-LN), then the output projection: x (T, D) -> logits (T, V). */
  function readOut(model, x) {
    return linear(model.cfg.norm_first ? layerNorm(x, model.p.decoder_norm) : x, model.generator, null);
  }

  /** The chosen token: the first maximal logit, compared in float32 (as PyTorch's argmax of
   * its float32 logits: equal there means the lower id wins); `nearTie` when the runner-up
   * is within NEAR_TIE, where float32 and float64 sums might order them otherwise. */
  function argmax(logits) {
    let best = 0;
    for (let i = 1; i < logits.length; i++) {
      if (Math.fround(logits[i]) > Math.fround(logits[best])) best = i;
    }
    let gap = Infinity;
    logits.forEach((v, i) => { if (i !== best) gap = Math.min(gap, Math.abs(logits[best] - v)); });
    return { token: best, gap, nearTie: gap < NEAR_TIE };
  }

  /** Switched-off heads: per kind and layer an array (H,) of null (on) or the replacement (K,). */
  function noSwitches(model) {
    const { n_encoder_layers: E, n_decoder_layers: L } = model.cfg;
    const none = (n) => Array.from({ length: n }, () => null);
    return { encoder: none(E), decoder: none(L), cross: none(L), hooks: null };
  }

  /** Heads switched off by name: [kind, layer, head, mode] items, mode "zero" or "mean" (the
   * head's mean output, `means["kind.layer"]` (H * K,), as `minitfm ablate` computes it). */
  function switchesFor(model, means, off) {
    const switches = noSwitches(model), H = model.cfg.n_heads, K = model.cfg.d_model / H;
    for (const [kind, layer, head, mode] of off) {
      const heads = switches[kind][layer] || (switches[kind][layer] = Array(H).fill(null));
      heads[head] = mode === "mean" ? means[`${kind}.${layer}`].slice(head * K, (head + 1) * K)
        : new Float32Array(K);
    }
    return switches;
  }

  /** Greedy decoding from BOS (book/model.py greedy_decode), with the KV cache, up to `cap`
   * tokens (EOS included): the decoded tokens, every step's logits and every attention map. */
  function greedyDecode(model, src, cap, switches) {
    switches = switches || noSwitches(model);
    const { bos_id: BOS, eos_id: EOS } = model.spec;
    const { memory, maps: encoderMaps } = encode(model, src, switches);
    const cache = newCache(model, memory);
    const decoded = [], steps = [];
    const L = model.cfg.n_decoder_layers, H = model.cfg.n_heads;
    const decoderMaps = Array.from({ length: L }, () => Array.from({ length: H }, () => []));
    const crossMaps = Array.from({ length: L }, () => Array.from({ length: H }, () => []));
    let token = BOS;
    for (let t = 0; t < cap; t++) {
      const step = decodeStep(model, token, t, cache, switches);
      for (let l = 0; l < L; l++) {
        for (let h = 0; h < H; h++) {
          decoderMaps[l][h].push(step.selfRows[l][h]); // row t: keys 0..t
          crossMaps[l][h].push(step.crossRows[l][h]); // row t: keys 0..S-1
        }
      }
      const choice = argmax(step.logits);
      steps.push({ input: token, logits: step.logits, ...choice });
      token = choice.token;
      decoded.push(token);
      if (token === EOS) break;
    }
    return { src, decoded, steps, maps: { encoder: encoderMaps, decoder: decoderMaps, cross: crossMaps } };
  }

  root.minitfmModel = {
    decodeFloats, loadWeights, makeModel, linear, layerNorm, feedForward, sinusoid, rotate,
    softmax, scaledDotProductAttention, multiHeadAttention, encode, newCache, decodeStep,
    readOut, argmax, noSwitches, switchesFor, greedyDecode, NEAR_TIE,
  };
})(typeof window !== "undefined" ? window : globalThis);
