/* The explorer's look inside the model: the role cards of `minitfm explain` (embedded: each
 * needs a thousand decodings per head), the activation patching view and the logit lens (both
 * computed here by patching.js, the maths of lab/interpret/patching.py and lens.py). page.js makes
 * one with its helpers and calls it; everything is shown as text or drawn on a canvas.
 */
(function (root) {
  "use strict";

  const M = root.minitfmModel, P = root.minitfmPatching;
  const KINDS = ["encoder", "decoder", "cross"];
  const SLICE = 4; // patched runs between two looks at the page: it stays responsive
  // A diverging scale for restored shares, -1 (blue) .. 0 (white) .. 1 (red), as the PNG's RdBu.
  const DIVERGING = [[33, 102, 172], [146, 197, 222], [247, 247, 247], [244, 165, 130], [178, 24, 43]];

  /** The background of a restored share (clipped to -1..1) and a text colour readable on it. */
  function diverging(value) {
    const x = (Math.min(Math.max(Number.isFinite(value) ? value : 0, -1), 1) + 1) / 2 * (DIVERGING.length - 1);
    const i = Math.min(Math.floor(x), DIVERGING.length - 2), f = x - i;
    const rgb = DIVERGING[i].map((c, k) => Math.round(c + f * (DIVERGING[i + 1][k] - c)));
    return { background: `rgb(${rgb.join(",")})`, color: Math.abs(value) > 0.6 ? "#fff" : "#000" };
  }

  const signless = (text) => (/^-0\.0*$/.test(text) ? text.slice(1) : text); // no "-0.00"

  /** ctx: the page's data, model, task and drawing helpers (el, drawCells, percent, short). */
  function makeInside(ctx) {
    const { data, model, task, el } = ctx;
    const H = model.cfg.n_heads;
    const layersOf = (kind) => (kind === "encoder" ? model.cfg.n_encoder_layers : model.cfg.n_decoder_layers);
    const points = (x) => signless((100 * x).toFixed(1));
    const two = (x) => signless(x.toFixed(2));
    const words = (ids) => ids.map(task.token).join(" ");

    // --- role cards (embedded) ---

    function card(c, rows) {
      const figure = el("figure", null, `card effect-${c.effect}`);
      figure.append(el("div", `${c.kind} L${c.layer} H${c.head} · ${c.pattern}`, "card-title"));
      const canvas = el("canvas"), n = Math.max(rows.length, rows[0].length);
      const cell = Math.max(2, Math.floor(96 / n));
      canvas.width = rows[0].length * cell; canvas.height = rows.length * cell;
      canvas.setAttribute("role", "img");
      canvas.setAttribute("aria-label", `mean attention of ${c.kind} layer ${c.layer} head ${c.head}`);
      const shown = c.kind === "decoder" ? rows.map((row, i) => row.slice(0, i + 1)) : rows; // causal: hatched
      ctx.drawCells(canvas.getContext("2d"), shown, rows[0].length, cell, 0, 0);
      figure.append(canvas);
      const [zLow, zHigh] = c.drop_zero_ci, [mLow, mHigh] = c.drop_mean_ci;
      figure.append(
        el("div", `fit ${c.pattern_score.toFixed(2)} (${c.best_fit}: strongest key in ${ctx.percent(c.pattern_rows)} of rows)`, "card-line"),
        el("div", `drop, zero: ${points(c.drop_zero)} pts [${points(zLow)}, ${points(zHigh)}]`, "card-line"),
        el("div", `drop, mean: ${points(c.drop_mean)} pts [${points(mLow)}, ${points(mHigh)}]`, "card-line"),
        el("div", `patching share ${two(c.restored)}`, "card-line"),
        el("figcaption", c.role, "card-role"));
      return figure;
    }

    function roleCards(box) {
      const rc = data.role_cards;
      if (!rc || rc.problem) {
        const why = rc ? `The role cards in ${rc.file} are left out: it ${rc.problem}.` : "No role cards for this checkpoint yet.";
        box.replaceChildren(el("p", `${why} Run minitfm explain RUN (it writes <run>/explain/<checkpoint>-step<N>.json beside its PNG), then minitfm explore RUN again.`, "hint"));
        return;
      }
      box.replaceChildren(el("p", `From ${rc.file} (minitfm explain, step ${rc.step}): drops on ${rc.samples} held-out sequences (intact exact match ${ctx.percent(rc.exact_match)}); patching shares over the first ${rc.patched_pairs} clean held-out inputs, each with a resampled corruption (the next held-out input of its length whose answer differs).`, "hint"));
      for (const kind of KINDS) {
        for (let l = 0; l < layersOf(kind); l++) {
          box.append(el("h3", `${kind} layer ${l}`));
          const grid = el("div", null, "cards");
          rc.heads.filter((c) => c.kind === kind && c.layer === l).sort((a, b) => a.head - b.head)
            .forEach((c) => grid.append(card(c, rc.maps[`${kind}.${l}`][c.head])));
          box.append(grid);
        }
      }
      const negligible = rc.heads.filter((c) => c.effect === "negligible").length;
      box.append(el("p", negligible
        ? `The ${negligible} negligible head(s) switched off at once: exact match falls ${points(rc.negligible_together)} points (heads are called negligible only as a group that costs at most 1).`
        : "No head is negligible: each costs more than 1 point alone, or the small ones together do.", "hint"));
    }

    // --- activation patching (computed here) ---

    let patchJob = null; // the patching running now: { cancelled }

    /** The patching of two typed inputs as steps of work, each a rerun of the model (yielding
     * what to say meanwhile); `out.result` at the end: the result, or { error }. The corrupted
     * input, when empty, is found as patching.corruption finds it, a candidate a step. */
    function* patchSteps(cleanText, corruptText, out) {
      const most = data.task.patch_max_tokens, clean = task.parseInput(String(cleanText), 1);
      if (clean.error) { out.result = clean; return; }
      const n = clean.src.length;
      if (n > most) { out.result = { error: `the clean input has ${n} tokens: the page patches inputs of at most ${most} (minitfm patch takes longer ones)` }; return; }
      let corrupt = null;
      const found = !String(corruptText || "").trim();
      if (found) {
        const answer = P.answerOf(model, task, clean.src);
        let tried = 0;
        for (const candidate of P.candidates(task, clean.src)) {
          if (!P.same(P.answerOf(model, task, candidate), answer)) { corrupt = candidate; break; }
          yield `looking for a one-token change that changes the answer: ${++tried} tried`;
        }
        if (!corrupt) { out.result = { error: "no single-token change of the clean input changes the model's answer: type a corrupted input yourself" }; return; }
      } else {
        const typed = task.parseInput(String(corruptText), 2);
        if (typed.error) { out.result = typed; return; }
        if (typed.src.length !== n) { out.result = { error: `the corrupted input has ${typed.src.length} tokens and the clean one ${n}: patching compares inputs of the same length` }; return; }
        corrupt = typed.src;
      }
      const batch = P.contrast(model, task, clean.src, corrupt);
      if (batch.error) { out.result = { error: batch.error }; return; }
      yield "running the clean and the corrupted input";
      const work = P.patching(model, batch), rows = [];
      for (const job of work.jobs) {
        rows.push(job());
        yield `patching… ${rows.length} of ${work.jobs.length} runs`;
      }
      out.result = { clean: clean.src, corrupt, found, batch, cleanDiff: work.cleanDiff, corruptDiff: work.corruptDiff,
                     heads: rows.slice(0, work.headCount), residual: rows.slice(work.headCount) };
    }

    /** Patch every head and the residual stream at every position, a few reruns at a time so
     * the page stays responsive; `show` sees the progress and the end. A Promise of the result
     * (or { error }, or null when a newer patching replaced this one). */
    function patch(cleanText, corruptText, show) {
      if (patchJob) patchJob.cancelled = true;
      const job = { cancelled: false }, out = {}, steps = patchSteps(cleanText, corruptText, out);
      patchJob = job;
      return new Promise((resolve) => {
        const slice = () => {
          if (job.cancelled) { resolve(null); return; }
          for (let k = 0; k < SLICE; k++) {
            const step = steps.next();
            if (step.done) {
              if (patchJob === job) patchJob = null;
              show(out.result);
              resolve(out.result);
              return;
            }
            if (k === SLICE - 1) show({ progress: step.value });
          }
          setTimeout(slice, 0);
        };
        slice(); // a typed input's error shows at once; the reruns go on in slices
      });
    }

    function shareCell(value) {
      const td = el("td", two(value), "num share");
      Object.assign(td.style, diverging(value));
      return td;
    }

    /** A table of restored shares: `rows` [label, values], columns labelled `columns`. */
    function shareTable(caption, columns, rows) {
      const table = el("table", null, "shares");
      table.append(el("caption", caption));
      const head = el("tr");
      head.append(el("th", ""));
      columns.forEach((c) => head.append(el("th", c, "tok")));
      table.append(head);
      for (const [label, values] of rows) {
        const tr = el("tr");
        tr.append(el("th", label));
        values.forEach((v) => tr.append(v == null ? el("td", "") : shareCell(v)));
        table.append(tr);
      }
      const wrap = el("div", null, "scroll");
      wrap.append(table);
      return wrap;
    }

    function showPatch(result, box) {
      const b = result.batch, tokens = (ids) => ids.map(task.token);
      const src = tokens(result.clean), bad = tokens(result.corrupt);
      const heads = [];
      for (const kind of KINDS) {
        for (let l = 0; l < layersOf(kind); l++) {
          heads.push([`${kind} L${l}`, result.heads.filter((r) => r.kind === kind && r.layer === l)
            .sort((x, y) => x.head - y.head).map((r) => r.restored)]);
        }
      }
      const stream = (name, layer) => result.residual.filter((r) => r.stream === name && r.layer === layer)
        .sort((x, y) => x.position - y.position).map((r) => r.restored);
      const E = model.cfg.n_encoder_layers, L = model.cfg.n_decoder_layers;
      const encoder = Array.from({ length: E + 1 }, (_, l) => [l === E ? "memory" : `encoder in L${l}`, stream("encoder", l)]);
      const decoder = Array.from({ length: L }, (_, l) => [`decoder out L${l}`, stream("decoder", l)]);
      const reads = tokens(b.decoderInput), writes = tokens(b.cleanAnswer), theirs = tokens(b.corruptAnswer);
      const written = (i) => ctx.short(writes[i]) + (i < theirs.length && theirs[i] !== writes[i] ? `/${ctx.short(theirs[i])}` : "");
      box.replaceChildren(
        shareTable("heads: restored share of each head's output (before W^O, every position)",
                   Array.from({ length: H }, (_, h) => `head ${h}`), heads),
        shareTable("residual stream, encoder side: restored share at each source position",
                   src.map((t, i) => (t === bad[i] ? `${i}: ${t}` : `${i}: ${t}/${bad[i]}`)), encoder),
        shareTable("residual stream, decoder side: restored share at each output position (read→written in the clean run; clean/corrupted where the answers differ)",
                   reads.map((t, i) => `${i}: ${ctx.short(t)}→${written(i)}`), decoder),
        el("p", "Red: restores the clean answer (1: all of it); blue: pushes towards the corrupted one; white: 0. Patching the memory, or the last decoder layer, at every position gives the clean run back exactly.", "hint"));
    }

    /** Section 5: the inputs, the button, the status line and the tables. */
    function patchView(start) {
      const clean = ctx.$("patch-clean"), corrupt = ctx.$("patch-corrupt");
      const status = ctx.$("patch-status"), error = ctx.$("patch-error"), box = ctx.$("patch-result");
      clean.value = start;
      const show = (r) => {
        error.textContent = r.error ? `error: ${r.error}` : "";
        if (r.error) { status.textContent = ""; box.replaceChildren(); return; }
        if (r.progress) { status.textContent = r.progress; return; }
        const positions = r.batch.scored.map(([t]) => t).join(", ");
        status.textContent = `clean ${words(r.clean)} → ${words(r.batch.cleanAnswer.slice(0, -1))} · ` +
          `corrupted ${words(r.corrupt)}${r.found ? " (the first one-token change that changes the answer)" : ""} → ` +
          `${words(r.batch.corruptAnswer.slice(0, -1))} · scored at output position(s) ${positions} · ` +
          `LD clean ${r.cleanDiff.toFixed(3)}, corrupted ${r.corruptDiff.toFixed(3)}`;
        showPatch(r, box);
      };
      const run = () => patch(clean.value, corrupt.value, show);
      ctx.$("patch-run").addEventListener("click", run);
      for (const input of [clean, corrupt]) {
        input.addEventListener("keydown", (event) => { if (event.key === "Enter") run(); });
      }
      return { run: (c, k) => { clean.value = c; corrupt.value = k || ""; return run(); } };
    }

    // --- the logit lens (computed here) ---

    function lensTable(box, p) {
      if (p.error || !p.lens) { box.replaceChildren(el("p", "fix the input above to see its logit lens", "hint")); return; }
      const { written, layers } = p.lens;
      const reads = [model.spec.bos_id, ...written.slice(0, -1)];
      const table = el("table", null, "lens");
      table.append(el("caption", "each decoder layer's output through the model's read-out: the token it would write and its probability"));
      const head = el("tr");
      head.append(el("th", "step"));
      reads.forEach((r, t) => head.append(el("th", `${t}: ${ctx.short(task.token(r))}→${ctx.short(task.token(written[t]))}`, "tok")));
      table.append(head);
      layers.forEach((steps, l) => {
        const tr = el("tr");
        tr.append(el("th", l === layers.length - 1 ? `decoder out L${l} (the output)` : `decoder out L${l}`));
        steps.forEach((s, t) => {
          const td = el("td", null, s.token === written[t] ? "lens-cell lens-written" : "lens-cell");
          td.append(el("span", `${task.token(s.token)} ${s.p.toFixed(2)}`));
          if (s.token !== written[t]) td.append(el("span", `${task.token(written[t])} ${s.p_written.toFixed(2)}`, "lens-other"));
          tr.append(td);
        });
        table.append(tr);
      });
      const wrap = el("div", null, "scroll");
      wrap.append(table);
      box.replaceChildren(wrap, el("p", "Bold: the layer would already write the model's token. Below a cell that would write another: the model's token and its probability at that layer.", "hint"));
    }

    return { roleCards, patchView, patch, lensTable };
  }

  root.minitfmInside = { makeInside, diverging };
})(typeof window !== "undefined" ? window : globalThis);
