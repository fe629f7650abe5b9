// Loads a trace into the Perfetto UI (the real one: its bundle and its trace_processor
// WebAssembly engine, served from a local directory, in headless Chromium, offline) and runs
// SQL queries on what the UI's engine parsed: a reader of stallscope's traces that is not
// stallscope's writer. scripts/install-deps.sh puts the UI in
// ~/.cache/stallscope/perfetto-ui.
//
// usage: node scripts/perfetto-query.mjs UI_DIR TRACE SQL [SQL...]
// prints {"queries": [[row, ...], ...]} (one array of rows per SQL) on stdout; exits 1 with
// the reason on stderr when the UI or the trace does not load within the time limit.
//
// Chromium is driven over the DevTools protocol on a pipe (--remote-debugging-pipe), so
// nothing beyond Node and Chromium is needed.
import {spawn} from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';

const [uiDir, trace, ...queries] = process.argv.slice(2);
if (!uiDir || !trace || queries.length === 0) {
  console.error('usage: node perfetto-query.mjs UI_DIR TRACE SQL [SQL...]');
  process.exit(2);
}
const LIMIT_MS = Number(process.env.PERFETTO_QUERY_TIMEOUT_MS ?? 180000);
const deadline = Date.now() + LIMIT_MS;
const fail = why => {
  console.error(`perfetto-query: ${why}`);
  process.exit(1);
};
setTimeout(() => fail(`gave up after ${LIMIT_MS} ms`), LIMIT_MS).unref();

const types = {'.js': 'text/javascript', '.mjs': 'text/javascript', '.wasm': 'application/wasm',
  '.html': 'text/html', '.css': 'text/css', '.json': 'application/json'};
const server = http.createServer((req, res) => {
  const p = decodeURIComponent(new URL(req.url, 'http://x').pathname);
  const file = p === '/trace-under-test' ? trace
    : path.join(uiDir, path.normalize(p === '/' ? 'index.html' : p));
  fs.readFile(file, (err, data) => {
    if (err) {
      res.writeHead(404);
      res.end();
      return;
    }
    res.writeHead(200, {'content-type': types[path.extname(file)] ?? 'application/octet-stream'});
    res.end(data);
  });
});
await new Promise(r => server.listen(0, '127.0.0.1', r));
const port = server.address().port;

const profileDir = fs.mkdtempSync(path.join(os.tmpdir(), 'perfetto-query-'));
const chrome = spawn(process.env.CHROMIUM ?? 'chromium',
  ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--remote-debugging-pipe',
    `--user-data-dir=${profileDir}`, 'about:blank'],
  {stdio: ['ignore', 'ignore', 'ignore', 'pipe', 'pipe']});
chrome.on('error', e => fail(`cannot start chromium: ${e.message}`));
const cleanup = async () => {
  const exited = new Promise(r => chrome.exitCode !== null ? r() : chrome.once('exit', r));
  chrome.kill();
  await exited;
  server.close();
  try {
    fs.rmSync(profileDir, {recursive: true, force: true});
  } catch (e) {
    console.error(`perfetto-query: left ${profileDir} (${e.message})`);
  }
};

let nextId = 1;
const waiting = new Map();
let pending = '';
chrome.stdio[4].on('data', d => {
  pending += d.toString();
  let end;
  while ((end = pending.indexOf('\0')) >= 0) {
    const msg = JSON.parse(pending.slice(0, end));
    pending = pending.slice(end + 1);
    if (msg.id && waiting.has(msg.id)) {
      waiting.get(msg.id)(msg);
      waiting.delete(msg.id);
    }
  }
});
function send(method, params = {}, sessionId) {
  const id = nextId++;
  chrome.stdio[3].write(JSON.stringify({id, method, params, sessionId}) + '\0');
  return new Promise((resolve, reject) => waiting.set(id, m =>
    m.error ? reject(new Error(`${method}: ${JSON.stringify(m.error)}`)) : resolve(m.result)));
}

try {
  const {targetId} = await send('Target.createTarget', {url: `http://127.0.0.1:${port}/`});
  const {sessionId} = await send('Target.attachToTarget', {targetId, flatten: true});
  const evaluate = async expression => {
    const r = await send('Runtime.evaluate',
      {expression, awaitPromise: true, returnByValue: true}, sessionId);
    if (r.exceptionDetails) {
      throw new Error(r.exceptionDetails.exception?.description ?? JSON.stringify(r.exceptionDetails));
    }
    return r.result.value;
  };
  const until = async (what, expression) => {
    while (!(await evaluate(expression))) {
      if (Date.now() > deadline) throw new Error(`${what} did not happen in time`);
      await new Promise(r => setTimeout(r, 200));
    }
  };
  // The UI's app object is what Perfetto's own UI tests drive.
  await until('the Perfetto UI loading', 'typeof window.app === "object" && !!window.app');
  await evaluate(`(async () => {
    const buffer = await (await fetch('/trace-under-test')).arrayBuffer();
    app.openTraceFromBuffer({buffer, title: 'trace under test', fileName: 'trace.json'});
  })()`);
  await until('the trace loading', '!!(window.app.trace && window.app.trace.engine)');
  const results = [];
  for (const sql of queries) {
    results.push(await evaluate(`(async () => {
      const r = await app.trace.engine.query(${JSON.stringify(sql)});
      const cols = r.columns();
      const rows = [];
      for (const it = r.iter({}); it.valid(); it.next()) {
        const row = {};
        for (const c of cols) {
          const v = it.get(c);
          row[c] = typeof v === 'bigint' ? Number(v) : v;
        }
        rows.push(row);
      }
      return rows;
    })()`));
  }
  console.log(JSON.stringify({queries: results}));
  await cleanup();
  process.exit(0);
} catch (e) {
  await cleanup();
  fail(e.message);
}
