// E2B's JavaScript SDK (@e2b/code-interpreter, with `e2b` under it), unchanged,
// against kernelgw's /e2b face: configured by the environment variables a user
// sets (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY). Run by
// tests/integration/e2b/test_js_sdk.py with NODE_PATH set; prints one JSON line
// of what it saw.
'use strict';
const { Sandbox } = require('@e2b/code-interpreter');

async function main() {
  const seen = {};
  const sbx = await Sandbox.create({ metadata: { from: 'js' }, timeoutMs: 120_000 });
  try {
    seen.id = sbx.sandboxId;
    await sbx.runCode('x = 40');
    const lines = [];
    const execution = await sbx.runCode('print("from python")\nx + 2', {
      onStdout: (m) => lines.push(m.line),
    });
    seen.text = execution.text;
    seen.stdout = lines;
    const failed = await sbx.runCode('1 / 0');
    seen.error = failed.error ? failed.error.name : null;
    await sbx.files.write('/home/user/notes.txt', 'written by js');
    seen.read = await sbx.files.read('/home/user/notes.txt');
    seen.fromCode = (await sbx.runCode("open('notes.txt').read()")).text;
    seen.listed = (await Sandbox.list({ query: { metadata: { from: 'js' } } }).nextItems()).map((s) => s.sandboxId);
    seen.running = await sbx.isRunning();
    const other = await Sandbox.connect(sbx.sandboxId);
    seen.connected = (await other.runCode('x')).text;
  } finally {
    seen.killed = await sbx.kill();
  }
  seen.runningAfter = await sbx.isRunning();
  console.log(JSON.stringify(seen));
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : err);
  process.exit(1);
});
