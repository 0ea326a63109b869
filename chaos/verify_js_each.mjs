// Many command lines of verify-js/verify.mjs in one Node process, for the test harness
// (chaos/verifiers.py, Verifier.run_many): starting Node costs ~40 ms a case on an idle
// 2-core machine, several times that under load, and the suite judges ~500 cases.
//
//   node chaos/verify_js_each.mjs VERIFY_MJS < jobs.json
//
// jobs.json is a JSON array of argument arrays; the answer is one JSON line per job,
// in order: {"exit": N, "stdout": "...", "stderr": "..."}, exactly what `node VERIFY_MJS
// ARGS...` would have written and returned (main() is synchronous and writes only through
// process.stdout.write / process.stderr.write, which are captured per job). A job whose
// main throws is reported as exit 70 with the error on its stderr, never a trace here.
import fs from 'node:fs';
import { pathToFileURL } from 'node:url';

const { main } = await import(pathToFileURL(process.argv[2]).href);
const jobs = JSON.parse(fs.readFileSync(0, 'utf8'));
const write = { out: process.stdout.write.bind(process.stdout), err: process.stderr.write.bind(process.stderr) };
const lines = [];
for (const args of jobs) {
  const got = { exit: null, stdout: '', stderr: '' };
  process.stdout.write = (chunk) => { got.stdout += String(chunk); return true; };
  process.stderr.write = (chunk) => { got.stderr += String(chunk); return true; };
  try {
    got.exit = main(args);
  } catch (e) {
    got.exit = 70;
    got.stderr += `verify_js_each: main threw: ${e && e.message ? e.message : e}\n`;
  } finally {
    process.stdout.write = write.out;
    process.stderr.write = write.err;
  }
  lines.push(JSON.stringify(got));
}
write.out(lines.join('\n') + (lines.length ? '\n' : ''));
