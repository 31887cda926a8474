/* A task's text in JavaScript: typed input -> source ids, ids -> text, as tasks/base.py's
 * Task.parse and Task.format_like do, with the same rules and the same messages as
 * `minitfm predict` (tests/lab/explore/test_explore.py compares them with Python's).
 *
 * `spec` comes from the page's data: the vocabulary (`tokens`), how text is read (`reading`:
 * "words" for the synthetic tasks, "add" for two numbers joined by '+', "modadd" for two
 * one-symbol numbers joined by '+', "char" or "space" for pairs), whether symbols may be written without spaces (`compact`), and the phrases of the
 * messages that Python writes (`allowed`, `example`).
 */
(function (root) {
  "use strict";

  const SPECIAL = ["<pad>", "<bos>", "<eos>"];
  const EOS_ID = 2;
  const QUOTE_LIMIT = 80; // errors.py QUOTE_LIMIT
  // Python's str.split() whitespace (not JavaScript's \s, which differs in a few characters).
  const SPACE = /[\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+/u;

  class TaskInputError extends Error {}

  /** Python's str.split(): the words between runs of whitespace. */
  function split(text) {
    return text.split(SPACE).filter((word) => word !== "");
  }

  /** Python's str.strip(). */
  function strip(text) {
    return text.replace(new RegExp(`^${SPACE.source}|${SPACE.source}$`, "gu"), "");
  }

  const chars = (text) => Array.from(text); // code points, as Python's list(text)

  /** Python's repr() of a string: 'abc', "it's", '\n' and other unprintables escaped. */
  function pyRepr(text) {
    const quote = text.includes("'") && !text.includes('"') ? '"' : "'";
    let out = quote;
    for (const ch of chars(text)) {
      const code = ch.codePointAt(0);
      if (ch === quote || ch === "\\") out += "\\" + ch;
      else if (ch === "\t") out += "\\t";
      else if (ch === "\n") out += "\\n";
      else if (ch === "\r") out += "\\r";
      else if (ch !== " " && /[\p{C}\p{Z}]/u.test(ch)) {
        const hex = code.toString(16);
        out += code < 0x100 ? "\\x" + hex.padStart(2, "0")
          : code < 0x10000 ? "\\u" + hex.padStart(4, "0") : "\\U" + hex.padStart(8, "0");
      } else out += ch;
    }
    return out + quote;
  }

  /** errors.py quote(): a bounded repr, reprlib's middle cut ('aaa...aaa'), then '…'. */
  function quote(text, limit = QUOTE_LIMIT) {
    let repr = pyRepr(text);
    if (repr.length > limit) {
      const c = chars(text);
      const i = Math.max(0, Math.floor((limit - 3) / 2)), j = Math.max(0, limit - 3 - i);
      const r = pyRepr(c.slice(0, i).join("") + c.slice(c.length - j).join(""));
      repr = r.slice(0, i) + "..." + r.slice(r.length - j);
    }
    return repr.length <= limit ? repr : repr.slice(0, limit - 1) + "…";
  }

  function makeTask(spec) {
    const ids = new Map(spec.tokens.map((token, i) => [token, i]));
    const isPairs = spec.reading === "char" || spec.reading === "space";
    const isSum = spec.reading === "add" || spec.reading === "modadd";

    /** Each word one symbol, except a lone compact word ("314"), read character by character. */
    function readWords(words) {
      if (spec.compact && words.length === 1 && !ids.has(words[0])) return chars(words[0]);
      return words;
    }

    function tokenize(text) {
      if (spec.reading === "char") return chars(text);
      if (spec.reading === "space") return split(text);
      if (isSum) {
        return text.split("+").flatMap((operand, k) =>
          [...(k > 0 ? ["+"] : []), ...readWords(split(operand))]);
      }
      return readWords(split(text));
    }

    function symbolId(token) {
      if (isPairs) return ids.has(token) && !spec.reserved.includes(token) ? ids.get(token) : spec.unk_id;
      if (SPECIAL.includes(token)) {
        throw new TaskInputError(`${pyRepr(token)} is a special token, not input: task '${spec.name}' takes ${spec.allowed}`);
      }
      if (!ids.has(token)) {
        const hint = spec.compact && chars(token).length > 1 ? " (a word between spaces is one symbol)" : "";
        throw new TaskInputError(`${pyRepr(token)} is not a symbol of task '${spec.name}': it takes ${spec.allowed}${hint}`);
      }
      return ids.get(token);
    }

    /** add: exactly one '+', a number on each side; modadd: one symbol on each side. */
    function checkStructure(src, text) {
      if (!isSum) return;
      const plus = ids.get("+"), count = src.filter((id) => id === plus).length;
      let problem = count === 0 ? "has no '+'" : `has ${count} '+' signs`;
      if (count === 1) {
        const i = src.indexOf(plus);
        if (spec.reading === "modadd") {
          problem = i !== 1 || src.length !== 3 ? "needs one number on each side of '+'" : "";
        } else {
          problem = i === 0 || i === src.length - 1 ? "needs a number on each side of '+'" : "";
        }
      }
      if (problem) {
        throw new TaskInputError(`${pyRepr(strip(text))} ${problem}: task '${spec.name}' takes ${spec.allowed}, e.g. ${pyRepr(spec.example)}`);
      }
    }

    /** Typed text -> source ids; a TaskInputError with Python's message otherwise. */
    function parse(text, maxTokens) {
      const tokens = tokenize(text);
      if (tokens.length === 0) {
        throw new TaskInputError(`empty input: task '${spec.name}' takes ${spec.allowed}, e.g. ${pyRepr(spec.example)}`);
      }
      const src = tokens.map(symbolId);
      if (maxTokens != null && src.length > maxTokens) {
        throw new TaskInputError(`input has ${src.length} tokens, more than the ${maxTokens} allowed: shorten it`);
      }
      checkStructure(src, text);
      return src;
    }

    /** `minitfm predict`'s parsing of input `number`: its message names the input. */
    function parseInput(text, number = 1) {
      try {
        return { src: parse(text, spec.max_tokens) };
      } catch (err) {
        if (!(err instanceof TaskInputError)) throw err;
        return { error: `input ${number} (${quote(text)}): ${err.message}` };
      }
    }

    /** Whether text is written without spaces between symbols ("314", "12+34"). */
    function writtenCompact(text) {
      if (spec.reading === "modadd") return false; // the answer is one symbol (ModAddTask)
      if (spec.reading === "add") return text.split("+").every((operand) => split(operand).length <= 1);
      const words = split(text);
      return spec.compact && words.length === 1 && chars(words[0]).length > 1;
    }

    /** Ids -> text (PAD and BOS dropped, EOS ends it), written as `text` is. */
    function formatLike(src, text) {
      const words = [];
      for (const id of src) {
        if (id === EOS_ID) break;
        if (id > EOS_ID) words.push(spec.tokens[id]);
      }
      return words.join(writtenCompact(text) ? "" : spec.separator);
    }

    /** The longest output decoding may write for a source of n tokens, EOS included. */
    function cap(n) {
      const caps = spec.caps, last = caps.length - 1; // caps[n] for n = 0..last, then linear
      return n <= last ? caps[n] : caps[last] + (caps[last] - caps[last - 1]) * (n - last);
    }

    function symbols(text) { // the symbols never trained on (pairs: read as <unk>)
      if (!isPairs) return [];
      const seen = [];
      for (const s of tokenize(text)) {
        if ((spec.reserved.includes(s) || !ids.has(s)) && !seen.includes(s)) seen.push(s);
      }
      return seen;
    }

    return { spec, parse, parseInput, formatLike, writtenCompact, cap, unknownSymbols: symbols,
             token: (id) => spec.tokens[id] };
  }

  root.minitfmTask = { makeTask, quote, pyRepr, split, TaskInputError };
})(typeof window !== "undefined" ? window : globalThis);
