// JupyterLab's own client library (@jupyterlab/services, as JupyterLab's and VS
// Code's notebooks use it against a Jupyter server) driving kernelgw's
// /api/sessions, /api/kernels and channels. Run by
// tests/integration/test_jupyter_lab_services.py with NODE_PATH set; prints one
// JSON line of what it saw.
'use strict';
const { ServerConnection, KernelManager, SessionManager } = require('@jupyterlab/services');
const WebSocket = require('ws');

async function main() {
  const baseUrl = process.env.KGW_URL;
  const serverSettings = ServerConnection.makeSettings({
    baseUrl,
    wsUrl: baseUrl.replace(/^http/, 'ws'),
    token: process.env.KGW_TOKEN,
    appendToken: true,
    WebSocket,
  });
  const kernelManager = new KernelManager({ serverSettings });
  const sessions = new SessionManager({ serverSettings, kernelManager });
  await sessions.ready;
  const session = await sessions.startNew({
    path: 'work/analysis.ipynb',
    name: 'analysis.ipynb',
    type: 'notebook',
    kernel: { name: 'python3' },
  });
  const kernel = session.kernel;
  const info = await kernel.info;
  let stdout = '';
  const future = kernel.requestExecute({ code: 'print(6 * 7)' });
  future.onIOPub = (msg) => {
    if (msg.header.msg_type === 'stream') stdout += msg.content.text;
  };
  const reply = await future.done;
  await sessions.refreshRunning();
  const running = Array.from(sessions.running()).map((m) => ({ id: m.id, path: m.path, kernel: m.kernel.id }));
  await session.setPath('work/renamed.ipynb');
  const found = await sessions.findByPath('work/renamed.ipynb');
  const kernelId = kernel.id;
  await session.shutdown();
  await sessions.refreshRunning();
  const after = Array.from(sessions.running()).length;
  const kernelsAfter = await fetch(`${baseUrl}/api/kernels`, {
    headers: { Authorization: `token ${process.env.KGW_TOKEN}` },
  }).then((r) => r.json());
  console.log(
    JSON.stringify({
      session: session.id,
      kernel: kernelId,
      language: info.language_info.name,
      stdout,
      status: reply.content.status,
      running,
      renamed: found ? found.path : null,
      after,
      kernelsAfter: kernelsAfter.map((k) => k.id),
    })
  );
  sessions.dispose();
  kernelManager.dispose();
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err && err.stack ? err.stack : String(err));
    process.exit(1);
  }
);
