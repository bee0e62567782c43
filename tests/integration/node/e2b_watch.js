// E2B's JavaScript SDK, unchanged, watches a sandbox's directory on kernelgw
// (envd's WatchDir stream, with entries and recursion) and writes with file
// metadata and gzip (what envd 0.6.x turns on in the SDK). Run by
// tests/integration/e2b/test_watch.py with NODE_PATH set; prints one JSON line
// of what it saw.
'use strict';
const { Sandbox } = require('@e2b/code-interpreter');

async function main() {
  const seen = {};
  const sbx = await Sandbox.create({ timeoutMs: 120_000 });
  try {
    await sbx.files.makeDir('/home/user/w');
    const events = [];
    const handle = await sbx.files.watchDir('/home/user/w', (e) => events.push(e), {
      recursive: true,
      includeEntry: true,
      timeoutMs: 0,
    });
    const written = await sbx.files.write('/home/user/w/sub/a.txt', 'js', { metadata: { From: 'js' } });
    seen.writtenMetadata = written.metadata;
    await sbx.files.write('/home/user/w/z.txt', 'zipped', { gzip: true });
    await sbx.runCode("import os\nos.remove('w/z.txt')");
    const deadline = Date.now() + 30_000;
    while (!events.some((e) => e.name === 'z.txt' && e.type === 'remove') && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    await handle.stop();
    seen.events = events.map((e) => [e.name, e.type]);
    const entry = events.find((e) => e.name === 'sub/a.txt' && e.type === 'write');
    seen.entry = entry && entry.entry ? { path: entry.entry.path, size: entry.entry.size, metadata: entry.entry.metadata } : null;
    seen.info = (await sbx.files.getInfo('/home/user/w/sub/a.txt')).metadata;
    seen.zipped = await sbx.files.exists('/home/user/w/z.txt');
  } finally {
    await sbx.kill();
  }
  console.log(JSON.stringify(seen));
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : err);
  process.exit(1);
});
