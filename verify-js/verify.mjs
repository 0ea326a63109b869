#!/usr/bin/env node
// An independent verifier of docket-receipt-1 receipts, for Node 18+, standard library only.
//
//   node verify-js/verify.mjs RECEIPT [--ledger LEDGER] [--json]
//   node verify-js/verify.mjs RUN --attestation ENVELOPE --pubkey KEY [--json]
//
// Written from spec/docket-receipt-1.md (the section numbers below are that document's), not
// from Docket's Python code: a bug shared by Docket's writer and its own verifier must not
// make a false receipt verify here too. Exit 0: ok; 1: a failed check (stdout:
// `FAIL CODE at seq S, byte O: DETAIL`); 2: an input error (stderr: one line ending `(CODE)`).
// With --json, one JSON object on stdout in every case: {ok, verdict, exit, code, seq, offset,
// field, message, events, head, bytes, unbacked, complete, tail_bytes} (the manifest's names).

import { createHash, createPublicKey, verify as cryptoVerify } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

const MAX_SAFE = Number.MAX_SAFE_INTEGER; // 2^53 - 1
const GENESIS = '0'.repeat(64);
const MAX_LINE = 64 * 1024 * 1024; // section 3.1
const MAX_RECEIPT = 16 * 1024 * 1024; // section 6.1
const MAX_DEPTH = 64; // rule 2.1.4
const CHUNK = 8 * 1024 * 1024;
const FORMAT = 'docket-receipt-1';
const UTF8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }); // a BOM stays a character
const HEX64 = /^[0-9a-f]{64}$/;
const PRICE = /^(0|[1-9][0-9]{0,8})(\.[0-9]{1,3})?$/; // section 6.3
const USD = /^(0|[1-9][0-9]*)\.[0-9]{9}$/;

// ---------------------------------------------------------------- strict JSON (section 2.1)
//
// Values: null, booleans, strings, Map (objects: no prototype keys, insertion order kept),
// Array, and numbers. An integer literal (no fraction, no exponent) within ±(2^53 − 1) is a JS
// number (-0 becomes 0); every other number is a JNum holding its text, so nothing is rounded.

class JNum {
  constructor(raw, isInt) {
    this.raw = raw;
    this.isInt = isInt;
  }
}

class JsonError extends Error {
  constructor(kind, message) {
    super(message);
    this.kind = kind; // 'syntax': not JSON; 'ambiguous': duplicate names or too deep
  }
}

let S = '';
let P = 0;
let D = 0;

function jfail(message, kind = 'syntax') {
  throw new JsonError(kind, `${message} at character ${P}`);
}

function ws() {
  for (;;) {
    const c = S.charCodeAt(P);
    if (c === 32 || c === 9 || c === 10 || c === 13) P++;
    else return;
  }
}

function parseStrict(text) {
  S = text;
  P = 0;
  D = 0;
  try {
    ws();
    const v = value();
    ws();
    if (P !== S.length) jfail('text after the value');
    return v;
  } finally {
    S = '';
  }
}

function value() {
  const c = S.charCodeAt(P);
  if (c === 34) return string();
  if (c === 123) return object();
  if (c === 91) return array();
  if (c === 45 || (c >= 48 && c <= 57)) return number();
  if (c === 116 && S.startsWith('true', P)) {
    P += 4;
    return true;
  }
  if (c === 102 && S.startsWith('false', P)) {
    P += 5;
    return false;
  }
  if (c === 110 && S.startsWith('null', P)) {
    P += 4;
    return null;
  }
  return jfail(Number.isNaN(c) ? 'unexpected end' : 'not a JSON value');
}

function object() {
  if (++D > MAX_DEPTH) jfail(`nested deeper than ${MAX_DEPTH} levels`, 'ambiguous');
  P++;
  const m = new Map();
  ws();
  if (S.charCodeAt(P) === 125) {
    P++;
    D--;
    return m;
  }
  for (;;) {
    if (S.charCodeAt(P) !== 34) jfail('expected a member name');
    const k = string();
    ws();
    if (S.charCodeAt(P) !== 58) jfail("expected ':'");
    P++;
    ws();
    const size = m.size;
    if (m.set(k, value()).size === size) jfail(`duplicate member name ${JSON.stringify(k)}`, 'ambiguous');
    ws();
    const c = S.charCodeAt(P);
    if (c === 44) {
      P++;
      ws();
    } else if (c === 125) {
      P++;
      D--;
      return m;
    } else jfail("expected ',' or '}'");
  }
}

function array() {
  if (++D > MAX_DEPTH) jfail(`nested deeper than ${MAX_DEPTH} levels`, 'ambiguous');
  P++;
  const a = [];
  ws();
  if (S.charCodeAt(P) === 93) {
    P++;
    D--;
    return a;
  }
  for (;;) {
    a.push(value());
    ws();
    const c = S.charCodeAt(P);
    if (c === 44) {
      P++;
      ws();
    } else if (c === 93) {
      P++;
      D--;
      return a;
    } else jfail("expected ',' or ']'");
  }
}

function hex4(i) {
  let u = 0;
  for (let k = i; k < i + 4; k++) {
    const c = S.charCodeAt(k);
    let d;
    if (c >= 48 && c <= 57) d = c - 48;
    else if (c >= 97 && c <= 102) d = c - 87;
    else if (c >= 65 && c <= 70) d = c - 55;
    else return jfail('bad \\u escape');
    u = u * 16 + d;
  }
  return u;
}

// A run of characters a string may hold as they are: no quote, backslash or control character.
const PLAIN_RUN = /[^"\\\u0000-\u001f]*/y;

function string() {
  P++;
  let start = P;
  let out = null;
  for (;;) {
    PLAIN_RUN.lastIndex = P; // the regular expression engine skips the plain run natively
    PLAIN_RUN.test(S);
    P = PLAIN_RUN.lastIndex;
    const c = S.charCodeAt(P);
    if (c === 34) {
      const tail = S.slice(start, P);
      P++;
      return out === null ? tail : out + tail;
    }
    if (c === 92) {
      out = (out === null ? '' : out) + S.slice(start, P);
      const e = S.charCodeAt(P + 1);
      P += 2;
      if (e === 34) out += '"';
      else if (e === 92) out += '\\';
      else if (e === 47) out += '/';
      else if (e === 98) out += '\b';
      else if (e === 102) out += '\f';
      else if (e === 110) out += '\n';
      else if (e === 114) out += '\r';
      else if (e === 116) out += '\t';
      else if (e === 117) {
        const u = hex4(P);
        P += 4;
        if (u >= 0xd800 && u <= 0xdbff) {
          // rule 2.1.5: a high surrogate must be followed by a \u low surrogate
          if (S.charCodeAt(P) !== 92 || S.charCodeAt(P + 1) !== 117) jfail('lone surrogate');
          const low = hex4(P + 2);
          if (low < 0xdc00 || low > 0xdfff) jfail('lone surrogate');
          P += 6;
          out += String.fromCharCode(u, low);
        } else if (u >= 0xdc00 && u <= 0xdfff) {
          jfail('lone surrogate');
        } else out += String.fromCharCode(u);
      } else jfail('bad escape');
      start = P;
      continue;
    }
    if (!(c >= 32)) jfail(Number.isNaN(c) ? 'unterminated string' : 'control character in a string');
    P++;
  }
}

function isDigit(c) {
  return c >= 48 && c <= 57;
}

function number() {
  const start = P;
  let c = S.charCodeAt(P);
  if (c === 45) c = S.charCodeAt(++P);
  if (c === 48) c = S.charCodeAt(++P);
  else if (c >= 49 && c <= 57) {
    do c = S.charCodeAt(++P);
    while (isDigit(c));
  } else jfail('bad number');
  let isInt = true;
  if (c === 46) {
    isInt = false;
    c = S.charCodeAt(++P);
    if (!isDigit(c)) jfail('bad number');
    do c = S.charCodeAt(++P);
    while (isDigit(c));
  }
  if (c === 101 || c === 69) {
    isInt = false;
    c = S.charCodeAt(++P);
    if (c === 43 || c === 45) c = S.charCodeAt(++P);
    if (!isDigit(c)) jfail('bad number');
    do c = S.charCodeAt(++P);
    while (isDigit(c));
  }
  const raw = S.slice(start, P);
  const problem = numberProblem(raw);
  if (problem !== null) jfail(problem, 'ambiguous');
  if (isInt && P - start <= 17) {
    const n = Number(raw); // exact up to 2^53; anything larger is not a safe integer
    if (Number.isSafeInteger(n)) return n === 0 ? 0 : n;
  }
  return new JNum(raw, isInt);
}

// Rule 2.1.7: a number's size, judged on its text before anything converts it. At most 32
// significand digits, at most 4 exponent digits, and unless it is zero, the power of ten of its
// first non-zero digit in [-300, 300].
const MAX_SIGNIFICAND = 32;
const MAX_EXPONENT_DIGITS = 4;
const MAX_ADJUSTED = 300;
const NUMBER_PARTS = /^-?(0|[1-9][0-9]*)(?:\.([0-9]+))?(?:[eE]([+-]?)([0-9]+))?$/;

function numberProblem(raw) {
  const m = NUMBER_PARTS.exec(raw);
  const whole = m[1];
  const frac = m[2] || '';
  const digits = whole.length + frac.length;
  if (digits > MAX_SIGNIFICAND) return `a number with ${digits} digits before its exponent (at most ${MAX_SIGNIFICAND})`;
  if (m[4] !== undefined && m[4].length > MAX_EXPONENT_DIGITS) {
    return `a number whose exponent has ${m[4].length} digits (at most ${MAX_EXPONENT_DIGITS})`;
  }
  const fracZeros = frac.length - frac.replace(/^0+/, '').length;
  if (whole === '0' && fracZeros === frac.length) return null; // zero, whatever its exponent
  const power = (m[3] === '-' ? -1 : 1) * Number(m[4] || '0');
  const adjusted = whole !== '0' ? power + whole.length - 1 : power - 1 - fracZeros;
  if (adjusted < -MAX_ADJUSTED || adjusted > MAX_ADJUSTED) {
    return `a number of magnitude 10^${adjusted} (at most 10^${MAX_ADJUSTED}, at least 10^-${MAX_ADJUSTED})`;
  }
  return null;
}

// A \u escape that leaves a lone surrogate, in a text JSON.parse accepted (so every backslash
// is inside a string and starts an escape, and escapes can be read left to right).
function hasLoneSurrogateEscape(text) {
  const re = /\\(?:u([0-9a-fA-F]{4})|[^u])/g;
  let highEnd = -1;
  let m;
  while ((m = re.exec(text)) !== null) {
    const u = m[1] === undefined ? -1 : parseInt(m[1], 16);
    if (highEnd >= 0) {
      if (m.index !== highEnd || u < 0xdc00 || u > 0xdfff) return true;
      highEnd = -1;
      continue;
    }
    if (u >= 0xd800 && u <= 0xdbff) highEnd = re.lastIndex;
    else if (u >= 0xdc00 && u <= 0xdfff) return true;
  }
  return highEnd >= 0;
}

// ---------------------------------------------------------------- values

function kind(v) {
  if (v === null) return 'null';
  if (typeof v === 'boolean') return 'boolean';
  if (typeof v === 'string') return 'string';
  if (typeof v === 'number' || typeof v === 'bigint' || v instanceof JNum) return 'number';
  if (Array.isArray(v)) return 'array';
  if (v instanceof Map) return 'object';
  return 'unknown';
}

const isObj = (v) => v instanceof Map;
function isHex64(v) {
  if (typeof v !== 'string' || v.length !== 64) return false;
  for (let i = 0; i < 64; i++) {
    const c = v.charCodeAt(i);
    if (!((c >= 48 && c <= 57) || (c >= 97 && c <= 102))) return false;
  }
  return true;
}
// Integers in [0, 2^53 − 1]: only in-range integer literals are JS numbers.
const isUint = (v) => typeof v === 'number' && v >= 0;
const isSint = (v) => typeof v === 'number'; // [−(2^53−1), 2^53−1]
const isStrOrNull = (v) => v === null || typeof v === 'string';

// The exact decimal value of a number as a canonical string: sign, digits without leading or
// trailing zeros, exponent (section 7.3: 1, 1.0 and 1e0 are equal; nothing is rounded).
function canon(v) {
  let raw;
  if (typeof v === 'number' || typeof v === 'bigint') raw = String(v);
  else raw = v.raw;
  const m = /^(-?)([0-9]+)(?:\.([0-9]+))?(?:[eE]([+-]?[0-9]+))?$/.exec(raw);
  const frac = m[3] || '';
  let digits = (m[2] + frac).replace(/^0+/, '');
  if (digits === '') return '0';
  let exp = BigInt(m[4] || '0') - BigInt(frac.length);
  const trimmed = digits.replace(/0+$/, '');
  exp += BigInt(digits.length - trimmed.length);
  digits = trimmed;
  return `${m[1]}${digits}e${exp}`;
}

// Code point order (section 7.3), not UTF-16 code unit order.
function cmpNames(a, b) {
  const ia = a[Symbol.iterator]();
  const ib = b[Symbol.iterator]();
  for (;;) {
    const x = ia.next();
    const y = ib.next();
    if (x.done || y.done) return x.done === y.done ? 0 : x.done ? -1 : 1;
    const cx = x.value.codePointAt(0);
    const cy = y.value.codePointAt(0);
    if (cx !== cy) return cx - cy;
  }
}

function join(prefix, name) {
  const part = /^[A-Za-z0-9_-]+$/.test(name) ? name : `[${JSON.stringify(name)}]`;
  if (prefix === '') return part;
  return part.startsWith('[') ? prefix + part : `${prefix}.${part}`;
}

const UNBACKED = Symbol('unbacked');

// The path of the first difference between a receipt value and its derivation, or null.
function firstDiff(got, want, at) {
  if (want === UNBACKED) return null;
  const kg = kind(got);
  if (kg !== kind(want)) return at;
  if (kg === 'object') {
    const names = [...new Set([...got.keys(), ...want.keys()])].sort(cmpNames);
    for (const name of names) {
      const here = join(at, name);
      if (want.get(name) === UNBACKED) continue;
      if (!got.has(name) || !want.has(name)) return here;
      const d = firstDiff(got.get(name), want.get(name), here);
      if (d !== null) return d;
    }
    return null;
  }
  if (kg === 'array') {
    const n = Math.min(got.length, want.length);
    for (let i = 0; i < n; i++) {
      const d = firstDiff(got[i], want[i], `${at}[${i}]`);
      if (d !== null) return d;
    }
    return got.length === want.length ? null : `${at}[${n}]`;
  }
  if (kg === 'number') return canon(got) === canon(want) ? null : at;
  return got === want ? null : at;
}

const obj = (entries) => new Map(entries);

// ---------------------------------------------------------------- outcomes

class Outcome extends Error {
  // A verdict that ends verification: exit 1 (a failed check) or 2 (an input error).
  constructor(exit, code, message, where = {}) {
    super(message);
    this.exit = exit;
    this.code = code;
    this.seq = where.seq ?? null;
    this.offset = where.offset ?? null;
    this.field = where.field ?? null;
  }
}

const inputError = (code, message) => new Outcome(2, code, message);
const failed = (code, message, where) => new Outcome(1, code, message, where);

// ---------------------------------------------------------------- step 1-3: the receipt

function readReceipt(file) {
  let st;
  try {
    st = fs.statSync(file);
  } catch (e) {
    throw inputError('receipt_unreadable', `cannot read the receipt ${file}: ${e.code || e.message}`);
  }
  if (!st.isFile()) throw inputError('receipt_unreadable', `the receipt ${file} is not a regular file`);
  if (st.size > MAX_RECEIPT) throw inputError('receipt_unreadable', `the receipt ${file} is larger than 16 MiB`);
  let bytes;
  try {
    bytes = fs.readFileSync(file);
  } catch (e) {
    throw inputError('receipt_unreadable', `cannot read the receipt ${file}: ${e.code || e.message}`);
  }
  if (bytes.length === 0) throw inputError('receipt_unreadable', `the receipt ${file} is empty`);
  if (bytes.length > MAX_RECEIPT) throw inputError('receipt_unreadable', `the receipt ${file} is larger than 16 MiB`);
  if (bytes.indexOf(0) !== -1) throw inputError('receipt_unreadable', `the receipt ${file} is binary (it holds a NUL byte)`);
  let text;
  try {
    text = UTF8.decode(bytes);
  } catch {
    throw inputError('receipt_unreadable', `the receipt ${file} is not UTF-8`);
  }
  // Step 2. Whether it is JSON at all is decided before duplicates and depth (which make it
  // JSON that is ambiguous): JSON.parse checks the grammar without a depth limit.
  try {
    JSON.parse(text);
  } catch (e) {
    throw inputError('receipt_not_json', `the receipt is not JSON: ${e.message}`);
  }
  if (hasLoneSurrogateEscape(text)) throw inputError('receipt_not_json', 'the receipt is not JSON: a \\u escape leaves a lone surrogate');
  let receipt;
  try {
    receipt = parseStrict(text);
  } catch (e) {
    if (!(e instanceof JsonError)) throw e;
    if (e.kind === 'syntax') throw inputError('receipt_not_json', `the receipt is not JSON: ${e.message}`);
    throw failed('receipt_malformed', `the receipt is ambiguous JSON: ${e.message}`);
  }
  if (!isObj(receipt)) throw inputError('not_a_receipt', 'the receipt is JSON but not an object');
  if (!receipt.has('format')) throw inputError('not_a_receipt', 'the JSON has no "format": not a receipt');
  if (receipt.get('format') !== FORMAT) {
    throw inputError('not_a_receipt', `the receipt's format is ${JSON.stringify(plain(receipt.get('format')))}, not ${FORMAT}`);
  }
  return receipt;
}

// Section 6.2 as a schema. A type is a function (value → true when it fits) or a shape:
// {obj: {name: type}, optional: [names]} | {map: type} | {arr: type}.
const T = {
  str: (v) => typeof v === 'string',
  strOrNull: isStrOrNull,
  uint: isUint,
  sintOrNull: (v) => v === null || isSint(v),
  uintOrNull: (v) => v === null || isUint(v),
  bool: (v) => typeof v === 'boolean',
  any: () => true,
  hex64: (v) => typeof v === 'string' && HEX64.test(v),
  price: (v) => typeof v === 'string' && PRICE.test(v),
  usd: (v) => typeof v === 'string' && USD.test(v),
  format: (v) => v === FORMAT,
  ledgerFile: (v) => typeof v === 'string' && v !== '' && !v.startsWith('/') && !v.includes('\\'),
  anyObj: isObj,
  objOrNull: (v) => v === null || isObj(v),
};
const SNAPSHOT_COUNTS = ['created', 'modified', 'deleted', 'mode_changed'];
const COUNTERS = ['model_calls', 'responses', 'errors', 'refused', 'input_tokens', 'output_tokens', 'cached_tokens', 'cost_nusd', 'unpriced_calls'];
const counterShape = { obj: Object.fromEntries([...COUNTERS.map((n) => [n, T.uint]), ['usd', T.usd]]) };
const capShape = { obj: { cap: T.str, seq: T.uint, limit: T.any, observed: T.any } };
// Section 6.5's claims: optional members of totals and faults, compared only when present.
const OPTIONAL_TOTALS = ['refused_by_rule', 'by_provider', 'by_upstream', 'breaker_transitions'];
const OPTIONAL_CLAIMS = [...OPTIONAL_TOTALS.map((m) => ['totals', m]), ['faults', 'by_layer']];
// The refusal events that are one guard's, and the rule each counts under (section 6.5).
const GUARD_REFUSALS = new Map([
  ['x-docket.rate-limited', 'rate_limit'],
  ['x-docket.breaker-open', 'breaker'],
  ['load.shed', 'load_shed'],
  ['net.denied', 'egress'],
]);
// Section 7.10: the fleet budget's amounts, and the fleet.lease members each total adds up.
const FLEET_DIMS = ['nusd', 'tokens', 'calls'];
const FLEET_AMOUNTS_SHAPE = { obj: Object.fromEntries(FLEET_DIMS.map((d) => [d, T.uint])) };
const FLEET_TOTALS = [['granted', 'granted'], ['reported', 'reported'], ['returned', 'unused'], ['lapsed', 'held']];
// What each change says became of the run's own lease (expired names a folded lease, anyone's).
const FLEET_ENDED_BY = new Map([['drawn', 'held'], ['renewed', 'held'], ['returned', 'returned'], ['lost', 'lost']]);
const RECEIPT_SHAPE = {
  obj: {
    format: T.format,
    docket_version: T.str,
    run_id: T.str,
    started_at: T.str,
    ended_at: T.str,
    duration_ms: T.uint,
    exit: { obj: { status: T.sintOrNull, reason: T.str, cap: T.strOrNull } },
    ledger: { obj: { file: T.ledgerFile, events: T.uint, head: T.hex64, bytes: T.uint } },
    totals: {
      obj: {
        ...counterShape.obj,
        by_model: { map: counterShape },
        refused_by_rule: { map: T.uint },
        by_provider: { map: counterShape },
        by_upstream: { map: counterShape },
        breaker_transitions: { map: { map: { map: T.uint } } },
      },
      optional: OPTIONAL_TOTALS, // section 6.5: absent, not claimed
    },
    pricing: {
      obj: {
        table_date: T.strOrNull,
        provenance: T.strOrNull,
        unit_prices: { map: { obj: { input: T.price, output: T.price, cached_input: T.price } } },
      },
    },
    caps: { obj: { limits: T.anyObj, warnings: { arr: capShape }, breaches: { arr: capShape } } },
    policy_digest: T.str,
    ops: {
      obj: {
        evidence: {
          obj: {
            ledger_complete: T.bool,
            unwritten_events: T.uint,
            first_failing_seq: T.uintOrNull,
            write_failures: T.uint,
            unrecorded_calls: T.uint,
            last_error: T.strOrNull,
            unwritten_by_type: { map: T.uint },
            unverified_tail: T.bool,
          },
          optional: ['unrecorded_calls', 'last_error', 'unwritten_by_type', 'unverified_tail'],
        },
        open_calls: { arr: { obj: { call_id: T.str, seq: T.uint } } },
        client_retries: { obj: { marked: T.uint, retries: T.uint, by_attempt: { map: T.uint } } },
        cache: { obj: { hits: T.uint, misses: T.uint, stored: T.uint, refused_by_reason: { map: T.uint }, saved_nusd: T.uint } },
      },
      optional: ['open_calls', 'client_retries', 'cache'],
    },
    faults: { obj: { seed: T.sintOrNull, plan: T.objOrNull, injected: T.uint, by_fault: { map: T.uint }, by_layer: { map: T.uint } }, optional: ['by_layer'] },
    snapshot: { arr: { obj: {
      index: T.uint, root: T.str, manifest_sha256: T.hex64, files: T.uint, bytes: T.uint,
      changes: (v) => v === null || shapeDeparture(v, { obj: Object.fromEntries(SNAPSHOT_COUNTS.map((n) => [n, T.uint])) }, '') === null,
      restored: (v) => v === null || shapeDeparture(v, { obj: { applied: T.uint, failed: T.uint, verified: T.bool } }, '') === null,
    } } },
    replay_of: { obj: { run_id: T.str, head: T.hex64 } },
    fleet: { obj: {
      budget: T.str,
      database: { obj: { host: T.strOrNull, port: T.strOrNull, dbname: T.strOrNull } },
      leases: { map: T.uint },
      granted: FLEET_AMOUNTS_SHAPE,
      reported: FLEET_AMOUNTS_SHAPE,
      returned: FLEET_AMOUNTS_SHAPE,
      lapsed: FLEET_AMOUNTS_SHAPE,
      refused_by_code: { map: T.uint },
      store_failures: T.uint,
      ended: T.str,
    } },
  },
  // section 7.7: a --snapshot run's only; 7.9: a replay's; 7.10: a [fleet] run's
  optional: ['snapshot', 'replay_of', 'fleet'],
};

// The path of the first departure from the shape, in the order of section 7.3, or null.
function shapeDeparture(v, shape, at) {
  if (typeof shape === 'function') return shape(v) ? null : at;
  if (shape.obj) {
    if (!isObj(v)) return at;
    const optional = new Set(shape.optional || []);
    const names = [...new Set([...Object.keys(shape.obj), ...v.keys()])].sort(cmpNames);
    for (const name of names) {
      const here = join(at, name);
      if (!Object.hasOwn(shape.obj, name)) return here;
      if (!v.has(name)) {
        if (optional.has(name)) continue;
        return here;
      }
      const d = shapeDeparture(v.get(name), shape.obj[name], here);
      if (d !== null) return d;
    }
    return null;
  }
  if (shape.map) {
    if (!isObj(v)) return at;
    for (const name of [...v.keys()].sort(cmpNames)) {
      const d = shapeDeparture(v.get(name), shape.map, join(at, name));
      if (d !== null) return d;
    }
    return null;
  }
  if (shape.arr) {
    if (!Array.isArray(v)) return at;
    for (let i = 0; i < v.length; i++) {
      const d = shapeDeparture(v[i], shape.arr, `${at}[${i}]`);
      if (d !== null) return d;
    }
    return null;
  }
  throw new Error('unknown shape');
}

// ---------------------------------------------------------------- section 5: the tally

class Tally {
  constructor() {
    this.start = null; // the session.start event
    this.end = null;
    this.endSeq = null;
    this.totals = newCounters();
    this.byModel = new Map();
    this.unitPrices = new Map(); // model → Map of the three prices
    this.warnings = new Map(); // cap → {cap, seq, limit, observed}
    this.breaches = new Map();
    this.injected = 0n;
    this.byFault = new Map();
    this.faultSeed = undefined; // the first fault.injected's seed, when there is no session.start
    this.gaps = []; // [lost, first_failing_seq]
    // call_id → seq of its earliest model.request since its last closing event (section 7.5:
    // calls are told apart by call_id, so a call_id is open once, however often it is asked).
    this.pending = new Map();
    // client_attempt (decimal string) → model.request events carrying it (section 7.6).
    this.attempts = new Map();
    // The response cache (section 7.8): hits, misses, stored, refusals by reason, saving.
    this.cache = { hits: 0, misses: 0, stored: 0, saved: 0, refused: new Map() };
    this.bad = null; // the first malformed_event: {seq, offset, message}
    this.snapshots = new Map(); // index → the receipt's snapshot entry (section 7.7)
    // Section 6.5: refusals by rule, counters by provider and by base URL, breaker
    // transitions (upstream → from → to → n), faults by layer.
    this.refusals = new Map();
    this.byProvider = new Map();
    this.byUpstream = new Map();
    this.callUpstream = new Map(); // call_id → the base_url of the model.request that opened it
    this.breaker = new Map();
    this.byLayer = new Map();
    // Section 7.10: lease changes, the amounts they moved, fleet refusals by code.
    this.fleet = {
      changes: new Map(),
      amounts: new Map(FLEET_TOTALS.map(([total]) => [total, new Map(FLEET_DIMS.map((d) => [d, 0]))])),
      refused: new Map(),
      storeFailures: 0,
      ended: 'none',
    };
  }

  // The receipt's fleet (section 7.10): null when session.start names no fleet.
  fleetClaim() {
    const start = opt(this.start, 'fleet');
    if (start === null) return null;
    const sorted = (m) => new Map([...m].sort((a, b) => cmpNames(a[0], b[0])));
    const f = this.fleet;
    return obj([
      ['budget', start.get('budget')],
      ['database', start.get('database')],
      ['leases', sorted(f.changes)],
      ...FLEET_TOTALS.map(([total]) => [total, f.amounts.get(total)]),
      ['refused_by_code', sorted(f.refused)],
      ['store_failures', f.storeFailures],
      ['ended', f.ended],
    ]);
  }

  add(ev, seq, offset) {
    if (this.bad !== null) return; // the verdict is malformed_event (or a chain failure) already
    const why = this.fold(ev, seq);
    if (why) this.bad = { seq, offset, message: why };
  }

  // Returns why the event is malformed, or undefined.
  fold(ev, seq) {
    const type = ev.get('type');
    if (this.end !== null) return `a ${type} event follows session.end (seq ${this.endSeq})`;
    switch (type) {
      case 'session.start': {
        if (seq !== 0) return 'session.start is not the first event';
        for (const n of ['run_id', 'docket_version', 'policy_digest']) if (typeof ev.get(n) !== 'string') return `session.start: ${n} is not a string`;
        const pricing = ev.get('pricing');
        if (!isObj(pricing)) return 'session.start: pricing is not an object';
        for (const n of ['table_date', 'provenance']) if (!isStrOrNull(opt(pricing, n))) return `session.start: pricing.${n} is not a string or null`;
        if (!isObj(ev.get('caps'))) return 'session.start: caps is not an object';
        const chaos = opt(ev, 'chaos');
        if (chaos !== null) {
          if (!isObj(chaos)) return 'session.start: chaos is not an object or null';
          if (!T.sintOrNull(opt(chaos, 'seed'))) return 'session.start: chaos.seed is not an integer or null';
        }
        const replayOf = opt(ev, 'replay_of'); // section 7.9
        if (replayOf !== null) {
          if (!isObj(replayOf) || replayOf.size !== 2 || !replayOf.has('run_id') || !replayOf.has('head')) return 'session.start: replay_of is not an object of exactly run_id and head, or null';
          if (typeof replayOf.get('run_id') !== 'string') return 'session.start: replay_of.run_id is not a string';
          if (!T.hex64(replayOf.get('head'))) return 'session.start: replay_of.head is not 64 lowercase hex digits';
        }
        const fleet = opt(ev, 'fleet'); // section 7.10
        if (fleet !== null) {
          if (!isObj(fleet) || fleet.size !== 2 || !fleet.has('budget') || !fleet.has('database')) return 'session.start: fleet is not an object of exactly budget and database, or null';
          if (typeof fleet.get('budget') !== 'string') return 'session.start: fleet.budget is not a string';
          const db = fleet.get('database');
          if (!isObj(db) || db.size !== 3 || !['host', 'port', 'dbname'].every((n) => db.has(n) && isStrOrNull(db.get(n)))) return 'session.start: fleet.database is not an object of exactly host, port and dbname, each a string or null';
        }
        this.start = ev;
        return undefined;
      }
      case 'fleet.lease': {
        const change = ev.get('change');
        if (typeof change !== 'string') return 'fleet.lease: change is not a string';
        const adds = [];
        for (const [total, prefix] of FLEET_TOTALS) {
          for (const d of FLEET_DIMS) {
            const n = opt(ev, `${prefix}_${d}`);
            if (n === null) continue;
            if (!isUint(n)) return `fleet.lease: ${prefix}_${d} is not an integer in [0, 2^53-1]`;
            adds.push([total, d, n]);
          }
        }
        for (const [total, d, n] of adds) bump(this.fleet.amounts.get(total), d, n);
        bump(this.fleet.changes, change, 1);
        if (FLEET_ENDED_BY.has(change)) this.fleet.ended = FLEET_ENDED_BY.get(change);
        return undefined;
      }
      case 'fleet.store': {
        this.fleet.storeFailures = sum(this.fleet.storeFailures, 1);
        return undefined;
      }
      case 'session.end': {
        if (typeof ev.get('reason') !== 'string') return 'session.end: reason is not a string';
        if (!T.sintOrNull(opt(ev, 'exit_status'))) return 'session.end: exit_status is not an integer or null';
        if (!isStrOrNull(opt(ev, 'cap'))) return 'session.end: cap is not a string or null';
        const why = checkEvidence(ev.get('evidence'));
        if (why) return `session.end: evidence ${why}`;
        const unrecorded = opt(ev, 'refused_unrecorded');
        if (unrecorded !== null && (!isObj(unrecorded) || ![...unrecorded.values()].every(isUint))) {
          return 'session.end: refused_unrecorded is not an object of integers';
        }
        if (unrecorded !== null) for (const [rule, n] of unrecorded) bump(this.refusals, rule, n);
        this.end = ev;
        this.endSeq = seq;
        return undefined;
      }
      case 'model.request': {
        const model = modelOf(ev);
        if (model === undefined) return 'model.request: model is not a string';
        const provider = textOf(ev, 'provider');
        if (provider === undefined) return 'model.request: provider is not a string';
        const baseUrl = textOf(ev, 'base_url');
        if (baseUrl === undefined) return 'model.request: base_url is not a string';
        const callId = opt(ev, 'call_id');
        if (!isStrOrNull(callId)) return 'model.request: call_id is not a string';
        const attempt = opt(ev, 'client_attempt');
        if (attempt !== null && !isUint(attempt)) return 'model.request: client_attempt is not an integer in [0, 2^53-1]';
        if (attempt !== null) this.attempts.set(String(attempt), sum(this.attempts.get(String(attempt)) || 0, 1));
        const looked = opt(ev, 'cache');
        if (looked !== null && looked !== 'miss') return 'model.request: cache is not "miss" or null';
        if (looked !== null) this.cache.misses = sum(this.cache.misses, 1);
        // Bytes forwarded other than the agent's: digest and changes together, or neither.
        const fwd = opt(ev, 'forwarded_sha256');
        const changes = opt(ev, 'forwarded_changes');
        if ((fwd === null) !== (changes === null)) return 'model.request: forwarded_sha256 and forwarded_changes come together';
        if (fwd !== null) {
          if (!isHex64(fwd)) return 'model.request: forwarded_sha256 is not 64 lowercase hex digits';
          if (fwd === opt(ev, 'request_sha256')) return 'model.request: forwarded_sha256 is request_sha256';
          if (!Array.isArray(changes) || changes.length === 0 || !changes.every((c) => typeof c === 'string')) {
            return 'model.request: forwarded_changes is not a non-empty array of strings';
          }
        }
        this.count(model, 'model_calls', 1);
        countIn(this.byProvider, provider, 'model_calls', 1);
        countIn(this.byUpstream, baseUrl, 'model_calls', 1);
        if (callId !== null && !this.pending.has(callId)) this.pending.set(callId, seq);
        if (callId !== null && !this.callUpstream.has(callId)) this.callUpstream.set(callId, baseUrl);
        return undefined;
      }
      case 'model.response':
      case 'model.error': {
        const model = modelOf(ev);
        if (model === undefined) return `${type}: model is not a string`;
        const callId = opt(ev, 'call_id');
        if (!isStrOrNull(callId)) return `${type}: call_id is not a string`;
        const provider = textOf(ev, 'provider');
        if (provider === undefined) return `${type}: provider is not a string`;
        const usage = opt(ev, 'usage');
        let tokens = [0, 0, 0];
        if (usage !== null) {
          if (!isObj(usage)) return `${type}: usage is not an object or null`;
          tokens = ['input_tokens', 'output_tokens', 'cached_tokens'].map((n) => (usage.has(n) ? usage.get(n) : 0));
          if (!tokens.every(isUint)) return `${type}: a usage member is not an integer in [0, 2^53-1]`;
        }
        const cost = ev.get('cost_nusd');
        if (!isUint(cost)) return `${type}: cost_nusd is not an integer in [0, 2^53-1]`;
        const stored = opt(ev, 'cache_stored');
        const refused = opt(ev, 'cache_refused');
        if (stored !== null && (stored !== true || refused !== null)) return `${type}: cache_stored is not true alone or null`;
        if (refused !== null && typeof refused !== 'string') return `${type}: cache_refused is not a string`;
        const storedDigest = opt(ev, 'cache_body_sha256');
        if (storedDigest !== null && (!T.hex64(storedDigest) || stored !== true)) return `${type}: cache_body_sha256 is not 64 lowercase hex digits beside cache_stored true, or null`;
        let priced = null;
        if (type === 'model.response') {
          priced = ev.get('priced');
          if (typeof priced !== 'boolean') return 'model.response: priced is not true or false';
          if (priced) {
            const up = ev.get('unit_prices');
            if (!isObj(up)) return 'model.response: unit_prices is not an object';
            for (const n of ['input', 'output', 'cached_input']) if (!T.price(up.get(n))) return `model.response: unit_prices.${n} is not a price string`;
            const prices = obj(['input', 'output', 'cached_input'].map((n) => [n, up.get(n)]));
            const before = this.unitPrices.get(model);
            if (before === undefined) this.unitPrices.set(model, prices);
            else if (['input', 'output', 'cached_input'].some((n) => prices.get(n) !== before.get(n))) return `model.response: the unit prices of ${JSON.stringify(model)} differ from an earlier response's`;
          }
        }
        // The upstream is the one its call's model.request named; "" for a call none opened.
        const upstream = callId !== null && this.callUpstream.has(callId) ? this.callUpstream.get(callId) : '';
        const closes = [
          [type === 'model.response' ? 'responses' : 'errors', 1],
          ['input_tokens', tokens[0]],
          ['output_tokens', tokens[1]],
          ['cached_tokens', tokens[2]],
          ['cost_nusd', cost],
          ...(priced === false ? [['unpriced_calls', 1]] : []),
        ];
        for (const [counter, n] of closes) {
          this.count(model, counter, n);
          countIn(this.byProvider, provider, counter, n);
          countIn(this.byUpstream, upstream, counter, n);
        }
        if (callId !== null) this.pending.delete(callId);
        if (callId !== null) this.callUpstream.delete(callId);
        if (stored !== null) this.cache.stored = sum(this.cache.stored, 1);
        if (refused !== null) this.cache.refused.set(refused, sum(this.cache.refused.get(refused) || 0, 1));
        return undefined;
      }
      case 'policy.denied': {
        const model = modelOf(ev);
        if (model === undefined) return 'policy.denied: model is not a string';
        const provider = textOf(ev, 'provider');
        if (provider === undefined) return 'policy.denied: provider is not a string';
        const rule = opt(ev, 'rule');
        if (!isStrOrNull(rule)) return 'policy.denied: rule is not a string or null';
        this.count(model, 'refused', 1);
        countIn(this.byProvider, provider, 'refused', 1);
        // Its rule up to the first "." (caps.max_usd counts under caps); none: "policy".
        const ruleKey = rule === null ? 'policy' : rule.split('.')[0];
        bump(this.refusals, ruleKey, 1);
        // Section 7.10: the same refusal, by the fleet's code (the rule after "fleet.").
        if (ruleKey === 'fleet') bump(this.fleet.refused, rule.slice(ruleKey.length + 1), 1);
        return undefined;
      }
      case 'x-docket.rate-limited':
      case 'x-docket.breaker-open':
      case 'load.shed':
      case 'net.denied':
        bump(this.refusals, GUARD_REFUSALS.get(type), 1);
        return undefined;
      case 'breaker.state': {
        const upstream = textOf(ev, 'upstream');
        if (upstream === undefined) return 'breaker.state: upstream is not a string or null';
        const from = ev.get('from');
        const to = ev.get('to');
        if (typeof from !== 'string' || typeof to !== 'string') return 'breaker.state: from or to is not a string';
        if (!this.breaker.has(upstream)) this.breaker.set(upstream, new Map());
        const froms = this.breaker.get(upstream);
        if (!froms.has(from)) froms.set(from, new Map());
        bump(froms.get(from), to, 1);
        return undefined;
      }
      case 'cap.warning':
      case 'cap.exceeded': {
        const cap = ev.get('cap');
        if (typeof cap !== 'string') return `${type}: cap is not a string`;
        if (!ev.has('limit') || !ev.has('observed')) return `${type}: limit or observed is missing`;
        const first = type === 'cap.warning' ? this.warnings : this.breaches;
        if (!first.has(cap)) first.set(cap, obj([['cap', cap], ['seq', seq], ['limit', ev.get('limit')], ['observed', ev.get('observed')]]));
        return undefined;
      }
      case 'fault.injected': {
        const fault = ev.get('fault');
        if (typeof fault !== 'string') return 'fault.injected: fault is not a string';
        const seed = opt(ev, 'seed');
        if (!T.sintOrNull(seed)) return 'fault.injected: seed is not an integer or null';
        let declared;
        if (this.start !== null) {
          const chaos = opt(this.start, 'chaos');
          declared = chaos === null ? null : opt(chaos, 'seed');
        } else {
          if (this.faultSeed === undefined) this.faultSeed = seed;
          declared = this.faultSeed;
        }
        if (seed !== declared) return `fault.injected: seed ${seed} is not the declared seed ${declared}`;
        const target = opt(ev, 'target');
        if (!isStrOrNull(target)) return 'fault.injected: target is not a string or null';
        // No target member: the fault text's own target, before its first ":" (fault grammar).
        bump(this.byLayer, target !== null ? target : fault.replace(/^[ \t]+/, '').split(':')[0], 1);
        this.injected += 1n;
        this.byFault.set(fault, (this.byFault.get(fault) || 0n) + 1n);
        return undefined;
      }
      case 'cache.hit': {
        const saved = ev.get('saved_nusd');
        if (!isUint(saved)) return 'cache.hit: saved_nusd is not an integer in [0, 2^53-1]';
        if (!isUint(ev.get('replays_seq'))) return 'cache.hit: replays_seq is not an integer in [0, 2^53-1]';
        const run = opt(ev, 'replays_run'); // a shared store's: the run whose ledger holds replays_seq
        if (run !== null && typeof run !== 'string') return 'cache.hit: replays_run is not a string or null';
        const served = opt(ev, 'body_sha256'); // the answer's bytes, as the closing event that stored it says
        if (served !== null && !T.hex64(served)) return 'cache.hit: body_sha256 is not 64 lowercase hex digits or null';
        this.cache.hits = sum(this.cache.hits, 1);
        this.cache.saved = sum(this.cache.saved, saved);
        return undefined;
      }
      case 'evidence.gap': {
        const lost = ev.get('lost');
        const ffs = ev.get('first_failing_seq');
        if (!isUint(lost)) return 'evidence.gap: lost is not an integer';
        if (!isUint(ffs)) return 'evidence.gap: first_failing_seq is not an integer';
        this.gaps.push([lost, ffs]);
        return undefined;
      }
      case 'snapshot.taken': {
        const index = ev.get('index');
        if (!isUint(index)) return 'snapshot.taken: index is not an integer';
        if (this.snapshots.has(index)) return `snapshot.taken: a second one for snapshot ${index}`;
        if (typeof ev.get('root') !== 'string') return 'snapshot.taken: root is not a string';
        if (!T.hex64(ev.get('manifest_sha256'))) return 'snapshot.taken: manifest_sha256 is not hex64';
        if (!isUint(ev.get('files')) || !isUint(ev.get('bytes'))) return 'snapshot.taken: files or bytes is not an integer';
        this.snapshots.set(index, obj([['index', index], ['root', ev.get('root')], ['manifest_sha256', ev.get('manifest_sha256')],
          ['files', ev.get('files')], ['bytes', ev.get('bytes')], ['changes', null], ['restored', null]]));
        return undefined;
      }
      case 'snapshot.changes':
      case 'snapshot.restored': {
        const index = ev.get('index');
        if (!isUint(index) || !this.snapshots.has(index)) return `${type}: index names no earlier snapshot.taken`;
        const entry = this.snapshots.get(index);
        if (type === 'snapshot.changes') {
          if (ev.has('error')) return undefined; // the scan failed: changes stay null
          const counts = ev.get('counts');
          if (!isObj(counts)) return 'snapshot.changes: counts is not an object';
          if (!SNAPSHOT_COUNTS.every((n) => isUint(counts.get(n)))) return 'snapshot.changes: a count is not an integer';
          entry.set('changes', obj(SNAPSHOT_COUNTS.map((n) => [n, counts.get(n)])));
          return undefined;
        }
        const failedList = ev.get('failed');
        if (!Array.isArray(failedList)) return 'snapshot.restored: failed is not an array';
        if (typeof ev.get('verified') !== 'boolean') return 'snapshot.restored: verified is not true or false';
        if (!isUint(ev.get('applied'))) return 'snapshot.restored: applied is not an integer';
        entry.set('restored', obj([['applied', ev.get('applied')], ['failed', failedList.length], ['verified', ev.get('verified')]]));
        return undefined;
      }
      default:
        return undefined; // counted in events, no claim derived from it (section 3.5)
    }
  }

  count(model, counter, n) {
    let c = this.byModel.get(model);
    if (c === undefined) {
      c = newCounters();
      this.byModel.set(model, c);
    }
    c[counter] = sum(c[counter], n);
    this.totals[counter] = sum(this.totals[counter], n);
  }

  // ops.cache as derived (section 7.8).
  cacheClaim() {
    const c = this.cache;
    return obj([['hits', c.hits], ['misses', c.misses], ['stored', c.stored], ['refused_by_reason', c.refused], ['saved_nusd', c.saved]]);
  }

  // ops.client_retries as derived (section 7.6).
  clientRetries() {
    let marked = 0;
    let retries = 0;
    for (const [attempt, n] of this.attempts) {
      marked = sum(marked, n);
      if (attempt !== '0') retries = sum(retries, n);
    }
    return obj([['marked', marked], ['retries', retries], ['by_attempt', this.attempts]]);
  }

  openCalls() {
    const open = [...this.pending].sort((a, b) => a[1] - b[1]);
    return open.map(([callId, seq]) => obj([['call_id', callId], ['seq', seq]]));
  }
}

// A member that is "absent or null: \"\"", else a string; undefined when it is neither.
function textOf(ev, name) {
  const v = opt(ev, name);
  if (v === null) return '';
  return typeof v === 'string' ? v : undefined;
}

function bump(map, key, n) {
  map.set(key, sum(map.get(key) || 0, n));
}

// One counter of section 6.4 in a map of counters (by provider, by base URL).
function countIn(map, key, counter, n) {
  let c = map.get(key);
  if (c === undefined) {
    c = newCounters();
    map.set(key, c);
  }
  c[counter] = sum(c[counter], n);
}

function newCounters() {
  return Object.fromEntries(COUNTERS.map((n) => [n, 0]));
}

// Exact sums: JS numbers while the result is a safe integer, BigInt beyond (costs are summed
// exactly, section 6.3, and a forged ledger may push them past 2^53 - 1).
function sum(a, b) {
  if (typeof a === 'number') {
    const r = a + b;
    if (r <= MAX_SAFE) return r;
  }
  return BigInt(a) + BigInt(b);
}

// A member that is "absent or null: null".
function opt(m, name) {
  return m.has(name) ? m.get(name) : null;
}

// The model an event counts under: absent or null is "", anything but a string is undefined.
function modelOf(ev) {
  const m = opt(ev, 'model');
  if (m === null) return '';
  return typeof m === 'string' ? m : undefined;
}

function checkEvidence(e) {
  if (!isObj(e)) return 'is not an object';
  if (typeof e.get('ledger_complete') !== 'boolean') return 'ledger_complete is not true or false';
  if (!isUint(e.get('unwritten_events'))) return 'unwritten_events is not an integer';
  if (!T.uintOrNull(e.get('first_failing_seq'))) return 'first_failing_seq is not an integer or null';
  if (!isUint(e.get('write_failures'))) return 'write_failures is not an integer';
  if (e.has('unrecorded_calls') && !isUint(e.get('unrecorded_calls'))) return 'unrecorded_calls is not an integer';
  if (e.has('last_error') && !isStrOrNull(e.get('last_error'))) return 'last_error is not a string or null';
  if (e.has('unverified_tail') && typeof e.get('unverified_tail') !== 'boolean') return 'unverified_tail is not true or false';
  if (e.has('unwritten_by_type')) {
    const by = e.get('unwritten_by_type');
    if (!isObj(by) || ![...by.values()].every(isUint)) return 'unwritten_by_type is not an object of integers';
  }
  return undefined;
}

function usd(nusd) {
  const n = BigInt(nusd);
  const whole = n / 1_000_000_000n;
  const frac = (n % 1_000_000_000n).toString().padStart(9, '0');
  return `${whole}.${frac}`;
}

function countersObj(c) {
  return obj([...COUNTERS.map((n) => [n, c[n]]), ['usd', usd(c.cost_nusd)]]);
}

// ---------------------------------------------------------------- step 4-5: the ledger

function openLedger(receiptPath, receipt, given) {
  const file = given ?? path.resolve(path.dirname(receiptPath), receipt.get('ledger').get('file'));
  let st;
  try {
    st = fs.statSync(file);
  } catch (e) {
    throw inputError('ledger_unreadable', `cannot read the ledger ${file}: ${e.code || e.message}`);
  }
  if (!st.isFile()) throw inputError('ledger_unreadable', `the ledger ${file} is not a regular file`);
  if (st.size === 0) throw inputError('empty_ledger', `the ledger ${file} is empty`);
  let fd;
  try {
    fd = fs.openSync(file, 'r');
  } catch (e) {
    throw inputError('ledger_unreadable', `cannot read the ledger ${file}: ${e.code || e.message}`);
  }
  const head = Buffer.alloc(5);
  let got = 0;
  try {
    for (;;) {
      const n = fs.readSync(fd, head, got, 5 - got, got);
      if (n === 0 || (got += n) === 5) break;
    }
  } catch (e) {
    fs.closeSync(fd);
    throw inputError('ledger_unreadable', `cannot read the ledger ${file}: ${e.code || e.message}`);
  }
  if (got < 5 || head.toString('latin1') !== '{"v":') {
    fs.closeSync(fd);
    throw inputError('not_a_ledger', `${file} is not a ledger: it does not begin with {"v":`);
  }
  return { fd, file };
}

// Section 4, folding each accepted event into the tally. `stopAfter`: read only that many lines
// (the receipt's unverified_tail). `mark`: the line whose offset step 6 may need.
function verifyChain(fd, tally, stopAfter, mark) {
  const chain = { count: 0, head: GENESIS, offset: 0, lastMono: 0, lastOffset: null, markOffset: null };
  const lineFail = (code, message) => failed(code, message, { seq: chain.count, offset: chain.offset });

  const accept = (line) => {
    if (chain.count === mark) chain.markOffset = chain.offset;
    if (line.length > MAX_LINE) throw lineFail('malformed_line', 'the line is longer than 64 MiB');
    let ev;
    try {
      ev = parseStrict(UTF8.decode(line));
    } catch (e) {
      if (e instanceof JsonError) throw lineFail('malformed_line', `not strict JSON: ${e.message}`);
      if (e instanceof TypeError) throw lineFail('malformed_line', 'not UTF-8');
      throw e;
    }
    if (!isObj(ev)) throw lineFail('malformed_line', 'the line is not a JSON object');
    for (const n of ['v', 'seq', 'ts', 'mono_ms', 'type', 'prev']) if (!ev.has(n)) throw lineFail('malformed_line', `the common field ${n} is missing`);
    const v = ev.get('v');
    if (!(isUint(v) || (v instanceof JNum && v.isInt && !v.raw.startsWith('-')))) throw lineFail('malformed_line', 'v is not an integer >= 0');
    const seq = ev.get('seq');
    const mono = ev.get('mono_ms');
    if (!isUint(seq)) throw lineFail('malformed_line', 'seq is not an integer in [0, 2^53-1]');
    if (!isUint(mono)) throw lineFail('malformed_line', 'mono_ms is not an integer in [0, 2^53-1]');
    if (typeof ev.get('ts') !== 'string') throw lineFail('malformed_line', 'ts is not a string');
    const type = ev.get('type');
    if (typeof type !== 'string' || type === '') throw lineFail('malformed_line', 'type is not a non-empty string');
    const prev = ev.get('prev');
    if (!isHex64(prev)) throw lineFail('malformed_line', 'prev is not 64 lowercase hex digits');
    if (v !== 1) throw lineFail('unsupported_version', `v is ${v instanceof JNum ? v.raw : v}, not 1`);
    if (seq !== chain.count) throw lineFail('seq_gap', `seq is ${seq}, expected ${chain.count}`);
    if (prev !== chain.head) throw lineFail('chain_break', 'prev does not match the hash of the line before');
    if (mono < chain.lastMono) throw lineFail('mono_regression', `mono_ms went down from ${chain.lastMono} to ${mono}`);
    tally.add(ev, chain.count, chain.offset);
    chain.head = createHash('sha256').update(line).digest('hex');
    chain.lastOffset = chain.offset;
    chain.count += 1;
    chain.offset += line.length + 1;
    chain.lastMono = mono;
  };

  let pieces = []; // the start of a line that runs past a chunk
  let pendingLen = 0;
  let pos = 0; // file position of the next read
  for (;;) {
    if (stopAfter !== null && chain.count >= stopAfter) return chain;
    const buf = Buffer.allocUnsafe(CHUNK);
    const n = fs.readSync(fd, buf, 0, CHUNK, pos);
    if (n === 0) break;
    pos += n;
    const view = buf.subarray(0, n);
    let start = 0;
    while (start < n) {
      const nl = view.indexOf(10, start);
      if (nl === -1) {
        pieces.push(view.subarray(start));
        pendingLen += n - start;
        // Neither a line nor a torn tail may pass 64 MiB: stop reading, memory stays bounded.
        if (pendingLen > MAX_LINE) throw lineFail('malformed_line', 'the line is longer than 64 MiB');
        break;
      }
      let line = view.subarray(start, nl);
      if (pendingLen > 0) {
        if (pendingLen + line.length > MAX_LINE) throw lineFail('malformed_line', 'the line is longer than 64 MiB');
        pieces.push(line);
        line = Buffer.concat(pieces, pendingLen + line.length);
        pieces = [];
        pendingLen = 0;
      }
      accept(line);
      start = nl + 1;
      if (stopAfter !== null && chain.count >= stopAfter) return chain;
    }
  }
  if (pendingLen > 0) throw lineFail('torn_tail', `${pendingLen} bytes after the last line feed (a torn write)`);
  return chain;
}

// ---------------------------------------------------------------- section 7.4 and 7.5

function checkEvidenceClaims(receipt, tally, events) {
  const E = receipt.get('ops').get('evidence');
  const bad = (name, message) => failed('evidence_mismatch', message, { field: `ops.evidence.${name}` });
  const complete = E.get('ledger_complete');
  const unwritten = E.get('unwritten_events');
  const ffs = E.get('first_failing_seq');
  if (complete !== (unwritten === 0)) throw bad('ledger_complete', `ledger_complete is ${complete} but unwritten_events is ${unwritten}`);
  if (complete && E.get('write_failures') !== 0) throw bad('write_failures', 'a complete ledger with write failures');
  if (complete && ffs !== null) throw bad('first_failing_seq', 'a complete ledger with a first failing seq');
  if (!complete && ffs === null) throw bad('first_failing_seq', 'an incomplete ledger without a first failing seq');
  if (ffs !== null && ffs > events) throw bad('first_failing_seq', `first_failing_seq ${ffs} is past the ledger's ${events} events`);
  if (complete && E.get('unverified_tail') === true) throw bad('unverified_tail', 'a complete ledger with an unverified tail');
  if (E.has('unwritten_by_type')) {
    let sum = 0n;
    for (const n of E.get('unwritten_by_type').values()) sum += BigInt(n);
    if (sum !== BigInt(unwritten)) throw bad('unwritten_by_type', `unwritten_by_type adds up to ${sum}, not ${unwritten}`);
  }
  const unrecorded = E.has('unrecorded_calls') ? E.get('unrecorded_calls') : 0;
  if (complete && unrecorded !== 0) throw bad('unrecorded_calls', 'a complete ledger with unrecorded calls');
  if (unrecorded > unwritten) throw bad('unrecorded_calls', `unrecorded_calls ${unrecorded} is more than unwritten_events ${unwritten}`);
  if (tally.end !== null) {
    const said = tally.end.get('evidence');
    for (const n of ['ledger_complete', 'unwritten_events', 'first_failing_seq', 'write_failures']) {
      if (firstDiff(E.get(n), said.get(n), '') !== null) throw bad(n, `${n} is not what session.end says`);
    }
    for (const n of ['unrecorded_calls', 'last_error', 'unverified_tail', 'unwritten_by_type']) {
      if (said.has(n) && (!E.has(n) || firstDiff(E.get(n), said.get(n), '') !== null)) throw bad(n, `${n} is not what session.end says`);
    }
  }
  if (complete && (tally.start === null || tally.end === null)) throw bad('ledger_complete', 'a ledger without session.start or session.end is not complete');
  if (tally.gaps.length > 0) {
    if (complete) throw bad('ledger_complete', 'the ledger records an evidence.gap');
    const lost = tally.gaps.reduce((s, [l]) => s + BigInt(l), 0n);
    if (BigInt(unwritten) < lost) throw bad('unwritten_events', `unwritten_events ${unwritten} is fewer than the ${lost} the gaps lost`);
    if (ffs !== tally.gaps[0][1]) throw bad('first_failing_seq', `first_failing_seq is not the first gap's ${tally.gaps[0][1]}`);
  }
}

function checkOpenCalls(receipt, tally) {
  const open = tally.openCalls();
  const ops = receipt.get('ops');
  if (open.length > 0 && ops.get('evidence').get('ledger_complete') === true) {
    throw failed('open_call', `the call ${JSON.stringify(open[0].get('call_id'))} has no closing event in a ledger said to be complete`, {
      seq: open[0].get('seq'),
      field: 'ops.open_calls',
    });
  }
  const stated = ops.has('open_calls') ? ops.get('open_calls') : [];
  const d = firstDiff(stated, open, 'ops.open_calls');
  if (d !== null) throw failed('open_call', `ops.open_calls does not name exactly the open calls (first difference: ${d})`, { field: d });
}

// ---------------------------------------------------------------- section 7.1-7.3: claims

function deriveClaims(tally, chain) {
  const s = tally.start;
  const e = tally.end;
  const U = UNBACKED;
  const byModel = new Map([...tally.byModel].map(([m, c]) => [m, countersObj(c)]));
  const totals = countersObj(tally.totals);
  totals.set('by_model', byModel);
  totals.set('refused_by_rule', tally.refusals);
  totals.set('by_provider', new Map([...tally.byProvider].map(([p, c]) => [p, countersObj(c)])));
  totals.set('by_upstream', new Map([...tally.byUpstream].map(([u, c]) => [u, countersObj(c)])));
  totals.set('breaker_transitions', tally.breaker);
  const firsts = (m) => [...m.values()].sort((a, b) => a.get('seq') - b.get('seq'));
  const pricing = s ? opt(s, 'pricing') : null;
  const chaos = s ? opt(s, 'chaos') : null;
  let seed;
  if (s) seed = chaos === null ? null : opt(chaos, 'seed');
  else seed = tally.faultSeed === undefined ? U : tally.faultSeed;
  let plan = U;
  if (s) plan = chaos === null ? null : new Map([...chaos].filter(([k]) => k !== 'seed'));
  return new Map([
    ['run_id', s ? s.get('run_id') : U],
    ['docket_version', s ? s.get('docket_version') : U],
    ['started_at', s ? s.get('ts') : U],
    ['ended_at', e ? e.get('ts') : U],
    ['duration_ms', s && e ? BigInt(e.get('mono_ms')) - BigInt(s.get('mono_ms')) : U],
    ['exit', e ? obj([['status', opt(e, 'exit_status')], ['reason', e.get('reason')], ['cap', opt(e, 'cap')]]) : U],
    ['totals', totals],
    [
      'pricing',
      obj([
        ['table_date', s ? opt(pricing, 'table_date') : U],
        ['provenance', s ? opt(pricing, 'provenance') : U],
        ['unit_prices', tally.unitPrices],
      ]),
    ],
    ['caps', obj([['limits', s ? s.get('caps') : U], ['warnings', firsts(tally.warnings)], ['breaches', firsts(tally.breaches)]])],
    ['policy_digest', s ? s.get('policy_digest') : U],
    ['faults', obj([['seed', seed], ['plan', plan], ['injected', tally.injected], ['by_fault', tally.byFault], ['by_layer', tally.byLayer]])],
    ['ledger', obj([['events', chain.count], ['head', chain.head], ['bytes', chain.offset]])],
  ]);
}

const CLAIMS = [
  ['run_id', 'run_mismatch'],
  ['docket_version', 'run_mismatch'],
  ['started_at', 'run_mismatch'],
  ['ended_at', 'run_mismatch'],
  ['duration_ms', 'duration_mismatch'],
  ['exit', 'exit_mismatch'],
  ['totals', 'total_mismatch'],
  ['pricing', 'pricing_mismatch'],
  ['caps', 'caps_mismatch'],
  ['policy_digest', 'policy_mismatch'],
  ['faults', 'faults_mismatch'],
];

// The unbacked claims, in the order of step 12, and within a claim in the order of 7.3.
function unbackedOf(claims) {
  const out = [];
  const walk = (v, at) => {
    if (v === UNBACKED) out.push(at);
    else if (isObj(v)) for (const k of [...v.keys()].sort(cmpNames)) walk(v.get(k), join(at, k));
  };
  for (const [name] of CLAIMS) walk(claims.get(name), name);
  return out;
}

// ---------------------------------------------------------------- section 8

function verify(receiptPath, ledgerPath) {
  const receipt = readReceipt(receiptPath);
  const shape = shapeDeparture(receipt, RECEIPT_SHAPE, '');
  if (shape !== null) throw failed('receipt_malformed', `the receipt is not shaped as docket-receipt-1 says, at ${shape}`, { field: shape });
  const ledger = receipt.get('ledger');
  const claimed = ledger.get('events');
  const evidence = receipt.get('ops').get('evidence');
  const unverifiedTail = evidence.get('unverified_tail') === true;
  const { fd } = openLedger(receiptPath, receipt, ledgerPath);
  const tally = new Tally();
  let chain;
  let size;
  try {
    size = fs.fstatSync(fd).size;
    chain = verifyChain(fd, tally, unverifiedTail ? claimed : null, claimed);
  } catch (e) {
    if (e instanceof Outcome && e.seq === 0 && (e.code === 'malformed_line' || e.code === 'unsupported_version')) {
      throw inputError('not_a_ledger', `not a ledger this verifier can read: its first line is ${e.code === 'malformed_line' ? 'malformed' : 'of another version'}: ${e.message}`);
    }
    if (e instanceof Outcome) throw e;
    throw inputError('ledger_unreadable', `cannot read the ledger: ${e.code || e.message}`);
  } finally {
    fs.closeSync(fd);
  }
  // Step 6-9.
  if (claimed !== chain.count) {
    const where = claimed < chain.count ? { seq: claimed, offset: chain.markOffset } : { seq: chain.count, offset: chain.offset };
    throw failed('count_mismatch', `the receipt says ${claimed} events, the ledger has ${chain.count}`, { ...where, field: 'ledger.events' });
  }
  if (ledger.get('head') !== chain.head) {
    const where = chain.count > 0 ? { seq: chain.count - 1, offset: chain.lastOffset } : {};
    throw failed('head_mismatch', `the receipt's head is not the hash of the last line (${chain.head})`, { ...where, field: 'ledger.head' });
  }
  if (ledger.get('bytes') !== chain.offset) {
    throw failed('bytes_mismatch', `the receipt says ${ledger.get('bytes')} bytes, the ledger has ${chain.offset}`, { field: 'ledger.bytes' });
  }
  if (tally.bad !== null) throw failed('malformed_event', tally.bad.message, { seq: tally.bad.seq, offset: tally.bad.offset });
  checkEvidenceClaims(receipt, tally, chain.count);
  checkOpenCalls(receipt, tally);
  const claims = deriveClaims(tally, chain);
  // Section 6.5: a claim the receipt does not make (a receipt from before it) is not compared.
  const compared = new Map(claims);
  for (const [parent, member] of OPTIONAL_CLAIMS) {
    if (!receipt.get(parent).has(member) && isObj(compared.get(parent))) {
      const less = new Map(compared.get(parent));
      less.delete(member);
      compared.set(parent, less);
    }
  }
  for (const [name, code] of CLAIMS) {
    const d = firstDiff(receipt.get(name), compared.get(name), name);
    if (d !== null) throw failed(code, `${d} is not what the ledger says`, { field: d });
  }
  const ops = receipt.get('ops');
  const noRetries = obj([['marked', 0], ['retries', 0], ['by_attempt', new Map()]]);
  const retried = firstDiff(ops.has('client_retries') ? ops.get('client_retries') : noRetries, tally.clientRetries(), 'ops.client_retries');
  if (retried !== null) throw failed('client_retries_mismatch', `${retried} is not what the ledger says`, { field: retried });
  // Section 7.7: absent means [].
  const snapshots = [...tally.snapshots].sort((a, b) => a[0] - b[0]).map(([, entry]) => entry);
  const stated = receipt.has('snapshot') ? receipt.get('snapshot') : [];
  const sd = firstDiff(stated, snapshots, 'snapshot');
  if (sd !== null) throw failed('snapshot_mismatch', `${sd} is not what the ledger says`, { field: sd });
  const noCache = obj([['hits', 0], ['misses', 0], ['stored', 0], ['refused_by_reason', new Map()], ['saved_nusd', 0]]);
  const cacheDiff = firstDiff(ops.has('cache') ? ops.get('cache') : noCache, tally.cacheClaim(), 'ops.cache');
  if (cacheDiff !== null) throw failed('cache_mismatch', `${cacheDiff} is not what the ledger says`, { field: cacheDiff });
  // Section 7.9: absent means not a replay; without a session.start, unbacked when stated.
  const unbacked = unbackedOf(claims);
  if (tally.start === null) {
    if (receipt.has('replay_of')) unbacked.push('replay_of');
  } else {
    const replayed = opt(tally.start, 'replay_of');
    const rd = firstDiff(receipt.has('replay_of') ? receipt.get('replay_of') : null, replayed, 'replay_of');
    if (rd !== null) throw failed('replay_mismatch', `${rd} is not what the ledger says`, { field: rd });
  }
  // Section 7.10: compared like replay_of; absent means the run held no fleet budget.
  if (tally.start === null) {
    if (receipt.has('fleet')) unbacked.push('fleet');
  } else {
    const fd = firstDiff(receipt.has('fleet') ? receipt.get('fleet') : null, tally.fleetClaim(), 'fleet');
    if (fd !== null) throw failed('fleet_mismatch', `${fd} is not what the ledger says`, { field: fd });
  }
  return {
    events: chain.count,
    head: chain.head,
    bytes: chain.offset,
    tail_bytes: unverifiedTail ? Math.max(0, size - chain.offset) : 0,
    complete: evidence.get('ledger_complete'),
    unbacked,
    totals: claims.get('totals'),
  };
}

// ---------------------------------------------------------------- attestations (spec/docket-attestation-1.md)
//
// A DSSE envelope holding an in-toto Statement v1 over a run's files, signed with Ed25519.
// The checks, in order (its section 5): the envelope (at most 1 MiB, strict JSON, shaped),
// a signature present, one that verifies over PAE with the given key, the payloadType,
// the statement, each subject's sha256 against the file, then for a run the receipt as
// above and the predicate's ledger figures against what that re-derived.

const MAX_ENVELOPE = 1024 * 1024;
const PAYLOAD_TYPE = 'application/vnd.in-toto+json';
const STATEMENT_TYPE = 'https://in-toto.io/Statement/v1';
const RUN_PREDICATE = 'https://docket.dev/attestation/run/v1';
const SUBJECT_FILES = new Map([
  [RUN_PREDICATE, ['ledger.jsonl', 'receipt.json']],
  ['https://docket.dev/attestation/gameday/v1', ['gameday.json', 'junit.xml']],
]);
const B64 = /^[A-Za-z0-9+/]*={0,2}$/;

function pae(type, body) {
  const t = Buffer.from(type, 'utf8');
  return Buffer.concat([Buffer.from(`DSSEv1 ${t.length} `), t, Buffer.from(` ${body.length} `), body]);
}

// Base64, standard or URL-safe, padded, that encodes back to itself; else null.
function b64Canonical(text) {
  const std = text.replace(/-/g, '+').replace(/_/g, '/');
  if (std.length % 4 !== 0 || !B64.test(std)) return null;
  const bytes = Buffer.from(std, 'base64');
  return bytes.toString('base64') === std ? bytes : null;
}

function readBounded(file, what, code, max) {
  let fd;
  try {
    fd = fs.openSync(file, 'r');
  } catch (e) {
    throw inputError(code, `cannot read the ${what} ${file}: ${e.code || e.message}`);
  }
  try {
    if (!fs.fstatSync(fd).isFile()) throw inputError(code, `the ${what} ${file} is not a regular file`);
    const buf = Buffer.alloc(max + 1);
    let n = 0;
    for (;;) {
      const got = fs.readSync(fd, buf, n, buf.length - n, null);
      if (got === 0) break;
      n += got;
      if (n === buf.length) break;
    }
    return buf.subarray(0, n);
  } catch (e) {
    if (e instanceof Outcome) throw e;
    throw inputError(code, `cannot read the ${what} ${file}: ${e.code || e.message}`);
  } finally {
    fs.closeSync(fd);
  }
}

// A subject's digest, read in chunks: a ledger may be larger than memory.
function sha256File(file, name, folder) {
  let fd;
  try {
    fd = fs.openSync(file, 'r');
    if (!fs.fstatSync(fd).isFile()) throw new Error('not a file');
  } catch {
    if (fd !== undefined) fs.closeSync(fd);
    throw failed('subject_missing', `subject ${name}: no such file in ${folder}`);
  }
  try {
    const h = createHash('sha256');
    const buf = Buffer.alloc(CHUNK);
    for (let n; (n = fs.readSync(fd, buf, 0, buf.length, null)) > 0; ) h.update(buf.subarray(0, n));
    return h.digest('hex');
  } catch (e) {
    throw failed('subject_missing', `subject ${name}: cannot read (${e.code || e.message})`);
  } finally {
    fs.closeSync(fd);
  }
}

function keyId(key) {
  const spki = key.export({ type: 'spki', format: 'der' });
  return createHash('sha256').update(spki.subarray(spki.length - 32)).digest('hex');
}

function loadPublicKey(file) {
  const pem = readBounded(file, 'public key', 'pubkey_unreadable', 16 * 1024);
  let key;
  try {
    key = createPublicKey({ key: pem, format: 'pem' });
  } catch (e) {
    throw inputError('pubkey_unreadable', `the public key ${file} is not a PEM public key: ${e.message}`);
  }
  if (key.asymmetricKeyType !== 'ed25519') throw inputError('pubkey_unreadable', `the public key ${file} is ${key.asymmetricKeyType}, not Ed25519`);
  return key;
}

function statementProblem(st) {
  if (!isObj(st)) return 'the payload is not a JSON object';
  if (st.get('_type') !== STATEMENT_TYPE) return `_type is not ${STATEMENT_TYPE}`;
  const kind = st.get('predicateType');
  if (!SUBJECT_FILES.has(kind)) return `predicateType is not one of ${[...SUBJECT_FILES.keys()].join(', ')}`;
  const subject = st.get('subject');
  if (!Array.isArray(subject)) return 'subject is not an array';
  const names = [];
  for (let i = 0; i < subject.length; i++) {
    const s = subject[i];
    const digest = isObj(s) ? s.get('digest') : undefined;
    if (!isObj(digest) || typeof s.get('name') !== 'string') return `subject[${i}] has no name and digest`;
    if (typeof digest.get('sha256') !== 'string' || !HEX64.test(digest.get('sha256'))) return `subject[${i}].digest.sha256 is not 64 lowercase hex digits`;
    names.push(s.get('name'));
  }
  const want = [...SUBJECT_FILES.get(kind)].sort();
  if (JSON.stringify([...names].sort()) !== JSON.stringify(want)) return `the subjects are not ${SUBJECT_FILES.get(kind).join(' and ')}, each once`;
  const p = st.get('predicate');
  if (!isObj(p)) return 'predicate is not an object';
  if (kind === RUN_PREDICATE) {
    const l = p.get('ledger');
    if (typeof p.get('run_id') !== 'string' || !isObj(l)) return 'predicate has no run_id and ledger';
    const count = (n) => Number.isInteger(n) && n >= 0; // a JNum past 2^53 - 1 is not a number here
    if (!count(l.get('events')) || typeof l.get('head') !== 'string' || !count(l.get('bytes'))) return 'predicate.ledger has no events, head and bytes (integers 0 to 2^53 - 1)';
  }
  return null;
}

function verifyAttested(run, attestation, pubkey) {
  const key = loadPublicKey(pubkey);
  let folder = run;
  try {
    if (!fs.statSync(run).isDirectory()) folder = path.dirname(run);
  } catch {
    folder = path.dirname(run);
  }
  const bytes = readBounded(attestation, 'attestation', 'attestation_unreadable', MAX_ENVELOPE);
  if (bytes.length > MAX_ENVELOPE) throw inputError('attestation_too_large', `the attestation ${attestation} is more than ${MAX_ENVELOPE} bytes (not read further)`);
  let env;
  try {
    env = parseStrict(UTF8.decode(bytes));
  } catch (e) {
    throw inputError('attestation_not_json', `the attestation ${attestation} is not JSON: ${e.message}`);
  }
  const bad = (m) => failed('envelope_malformed', m);
  if (!isObj(env)) throw bad('the envelope is not a JSON object');
  const type = env.get('payloadType');
  if (typeof type !== 'string') throw bad('payloadType is not a string');
  if (typeof env.get('payload') !== 'string') throw bad('payload is not a string');
  const body = b64Canonical(env.get('payload'));
  if (body === null) throw bad('payload is not canonical base64');
  const sigs = env.has('signatures') && env.get('signatures') !== null ? env.get('signatures') : [];
  if (!Array.isArray(sigs)) throw bad('signatures is not an array');
  const raw = sigs.map((s, i) => {
    if (!isObj(s) || typeof s.get('sig') !== 'string') throw bad(`signatures[${i}] has no sig string`);
    const b = b64Canonical(s.get('sig'));
    if (b === null) throw bad(`signatures[${i}].sig is not canonical base64`);
    return b;
  });
  if (raw.length === 0) throw failed('signature_missing', 'the envelope carries no signature');
  const message = pae(type, body);
  const id = keyId(key);
  if (!raw.some((sig) => sig.length === 64 && cryptoVerify(null, message, key, sig))) {
    throw failed('signature_invalid', `no signature verifies over the envelope with key ${id}`);
  }
  if (type !== PAYLOAD_TYPE) throw failed('payload_type_mismatch', `payloadType is ${JSON.stringify(type)}, not ${PAYLOAD_TYPE}`);
  let st;
  try {
    st = parseStrict(UTF8.decode(body));
  } catch (e) {
    throw failed('statement_malformed', `the payload is not JSON: ${e.message}`);
  }
  const problem = statementProblem(st);
  if (problem !== null) throw failed('statement_malformed', problem);
  const subjects = [];
  for (const s of st.get('subject')) {
    const name = s.get('name');
    const file = path.join(folder, name);
    const have = sha256File(file, name, folder);
    if (have !== s.get('digest').get('sha256')) throw failed('subject_mismatch', `subject ${name}: sha256 ${have} on disk, ${s.get('digest').get('sha256')} signed`);
    subjects.push(name);
  }
  const kind = st.get('predicateType');
  const out = { kind, keyid: id, subjects, receipt: null };
  if (kind !== RUN_PREDICATE) return out;
  const [ledgerName, receiptName] = SUBJECT_FILES.get(RUN_PREDICATE);
  out.receipt = verify(path.join(folder, receiptName), path.join(folder, ledgerName));
  const claimed = st.get('predicate').get('ledger');
  for (const [name, have] of [['events', out.receipt.events], ['head', out.receipt.head], ['bytes', out.receipt.bytes]]) {
    if (claimed.get(name) !== have) throw failed('predicate_mismatch', `predicate.ledger.${name} is ${JSON.stringify(claimed.get(name))}, the ledger's is ${JSON.stringify(have)}`);
  }
  return out;
}

function attestedLine(a) {
  const what = a.receipt === null ? 'game-day report' : 'run';
  const line = `attested ${what} (key ${a.keyid}; ${a.subjects.join(', ')} match)`;
  return a.receipt === null ? line : `${line}; ${okLine(a.receipt)}`;
}

// ---------------------------------------------------------------- the command (section 10)

// A parsed JSON value back to plain JS, for messages.
function plain(v) {
  if (v instanceof Map) return Object.fromEntries([...v].map(([k, w]) => [k, plain(w)]));
  if (Array.isArray(v)) return v.map(plain);
  if (v instanceof JNum) return v.raw;
  if (typeof v === 'bigint') return v.toString();
  return v;
}

function okLine(r) {
  const t = r.totals;
  let line =
    `ok: ${r.events} events, head ${r.head}, ${r.bytes} bytes; ` +
    `${t.get('model_calls')} model calls, ${t.get('input_tokens')} input + ${t.get('output_tokens')} output tokens, ` +
    `$${t.get('usd')}; ${r.complete ? 'ledger complete' : 'ledger incomplete (disclosed)'}`;
  if (r.tail_bytes) line += `; ${r.tail_bytes} bytes past the record, from a write that failed and could not be cut back (disclosed, not verified)`;
  if (r.unbacked.length) line += `; not backed by the ledger: ${r.unbacked.join(', ')}`;
  return line;
}

const USAGE = 'usage: node verify.mjs RECEIPT [--ledger LEDGER] [--json] | RUN --attestation ENVELOPE --pubkey KEY [--json]';

function parseArgs(argv) {
  const args = { receipt: null, ledger: null, json: false, attestation: null, pubkey: null };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--json') args.json = true;
    else if (a === '--ledger') {
      if (i + 1 >= argv.length) throw new Error('--ledger needs a path');
      args.ledger = argv[++i];
    } else if (a.startsWith('--ledger=')) args.ledger = a.slice('--ledger='.length);
    else if (a === '--attestation' || a === '--pubkey') {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a path`);
      args[a.slice(2)] = argv[++i];
    } else if (a.startsWith('--attestation=')) args.attestation = a.slice('--attestation='.length);
    else if (a.startsWith('--pubkey=')) args.pubkey = a.slice('--pubkey='.length);
    else if (a === '-h' || a === '--help') args.help = true;
    else if (a.startsWith('-') && a !== '-') throw new Error(`unknown option ${a}`);
    else if (args.receipt === null) args.receipt = a;
    else throw new Error(`unexpected argument ${a}`);
  }
  if (!args.help && args.receipt === null) throw new Error('no receipt given');
  if ((args.attestation === null) !== (args.pubkey === null)) throw new Error('--attestation and --pubkey go together');
  if (args.attestation !== null && args.ledger !== null) throw new Error('--ledger is not taken with --attestation: the subjects name the ledger');
  return args;
}

function main(argv) {
  let args;
  try {
    args = parseArgs(argv);
  } catch (e) {
    process.stderr.write(`verify.mjs: ${e.message}; ${USAGE} (usage)\n`);
    return 2;
  }
  if (args.help) {
    process.stdout.write(`${USAGE}\nChecks a docket-receipt-1 receipt against its ledger (spec/docket-receipt-1.md),\nwith --attestation first a signed DSSE envelope over the run's files (spec/docket-attestation-1.md).\nExit 0: ok; 1: a failed check; 2: an input error.\n`);
    return 0;
  }
  let out;
  try {
    if (args.attestation !== null) {
      const a = verifyAttested(args.receipt, args.attestation, args.pubkey);
      const r = a.receipt;
      out = { ok: true, verdict: 'ok', exit: 0, code: null, seq: null, offset: null, field: null, message: attestedLine(a) };
      out = { ...out, events: r ? r.events : null, head: r ? r.head : null, bytes: r ? r.bytes : null, unbacked: r ? r.unbacked : [], complete: r ? r.complete : null, tail_bytes: r ? r.tail_bytes : 0 };
      out.attestation = { kind: a.kind, keyid: a.keyid, subjects: a.subjects };
    } else {
      const r = verify(args.receipt, args.ledger);
      out = { ok: true, verdict: 'ok', exit: 0, code: null, seq: null, offset: null, field: null, message: okLine(r) };
      out = { ...out, events: r.events, head: r.head, bytes: r.bytes, unbacked: r.unbacked, complete: r.complete, tail_bytes: r.tail_bytes };
    }
  } catch (e) {
    if (!(e instanceof Outcome)) {
      // Not a verdict: a fault of this program, named in one line, never a trace.
      process.stderr.write(`verify.mjs: internal error: ${e && e.message ? e.message : e} (internal_error)\n`);
      return 3;
    }
    out = { ok: false, verdict: e.exit === 1 ? 'fail' : 'input_error', exit: e.exit, code: e.code, seq: e.seq, offset: e.offset, field: e.field, message: e.message };
  }
  if (args.json) {
    process.stdout.write(`${JSON.stringify(out)}\n`);
  } else if (out.exit === 0) {
    process.stdout.write(`${out.message}\n`);
  } else if (out.exit === 1) {
    const where = [];
    if (out.seq !== null) where.push(`seq ${out.seq}`);
    if (out.offset !== null) where.push(`byte ${out.offset}`);
    const at = where.length ? ` at ${where.join(', ')}` : '';
    process.stdout.write(`FAIL ${out.code}${at}: ${oneLine(out.message)}\n`);
  } else {
    process.stderr.write(`verify.mjs: ${oneLine(out.message)} (${out.code})\n`);
  }
  return out.exit;
}

function oneLine(s) {
  return String(s).replace(/[\r\n]+/g, ' ');
}

export { parseStrict, JsonError, JNum, canon, firstDiff, verify, main };

// Run as a command, not when imported (the tests import the strict JSON reader). Real paths,
// so that a symlink to this file (node ~/bin/verify.mjs) still runs it rather than exit 0 silently.
function invokedAsCommand() {
  try {
    return !!process.argv[1] && fs.realpathSync(process.argv[1]) === fs.realpathSync(fileURLToPath(import.meta.url));
  } catch {
    return false;
  }
}

if (invokedAsCommand()) process.exitCode = main(process.argv.slice(2));
