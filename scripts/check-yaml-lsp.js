#!/usr/bin/env node
// Drives the YAML language server (what VS Code, Neovim, Helix and Zed run for YAML) over LSP on
// stdio, as an editor does, on a shipped config: checks that the `# yaml-language-server:
// $schema=ember.schema.json` line makes it complete keys and enum values, show a key's
// documentation on hover, report nothing on the config as shipped, and flag an unknown key, an
// unknown enum value, an out-of-range value and a broken rule between keys.
//
// Needs Node and the server from npm; scripts/check-editor.sh installs a pinned one and runs this:
//   node scripts/check-yaml-lsp.js PATH/TO/node_modules/.bin/yaml-language-server
// Exits 1 if any expectation fails; prints what the server answered.
"use strict";
const { spawn } = require("child_process");
const fs = require("fs");
const path = require("path");

const server = process.argv[2];
const configs = path.resolve(__dirname, "..", "configs");
const config = path.join(configs, "quickstart.yaml");
if (!server) {
  console.error("usage: check-yaml-lsp.js PATH/TO/yaml-language-server");
  process.exit(2);
}

const proc = spawn(server, ["--stdio"], { stdio: ["pipe", "pipe", "inherit"] });
let buffer = Buffer.alloc(0);
let nextId = 1;
const pending = new Map();
const diagnostics = new Map();
const diagnosticWaiters = [];

function send(message) {
  const body = Buffer.from(JSON.stringify({ jsonrpc: "2.0", ...message }), "utf8");
  proc.stdin.write(`Content-Length: ${body.length}\r\n\r\n`);
  proc.stdin.write(body);
}
function request(method, params) {
  const id = nextId++;
  send({ id, method, params });
  return new Promise((resolve) => pending.set(id, resolve));
}
function notify(method, params) {
  send({ method, params });
}
proc.stdout.on("data", (chunk) => {
  buffer = Buffer.concat([buffer, chunk]);
  for (;;) {
    const headerEnd = buffer.indexOf("\r\n\r\n");
    if (headerEnd < 0) return;
    const length = Number(/Content-Length: (\d+)/i.exec(buffer.slice(0, headerEnd).toString())[1]);
    if (buffer.length < headerEnd + 4 + length) return;
    const message = JSON.parse(buffer.slice(headerEnd + 4, headerEnd + 4 + length).toString("utf8"));
    buffer = buffer.slice(headerEnd + 4 + length);
    if (message.id !== undefined && pending.has(message.id) && message.method === undefined) {
      pending.get(message.id)(message.result);
      pending.delete(message.id);
    } else if (message.method === "textDocument/publishDiagnostics") {
      diagnostics.set(message.params.uri, message.params.diagnostics);
      diagnosticWaiters.splice(0).forEach((w) => w());
    } else if (message.id !== undefined && message.method) {
      // Requests from the server (configuration, registration): answer as an editor would.
      const result = message.method === "workspace/configuration" ? message.params.items.map(() => settings.yaml) : null;
      send({ id: message.id, result });
    }
  }
});

const settings = { yaml: { validate: true, completion: true, hover: true, schemaStore: { enable: false } } };
let version = 0;
async function open(uri, text) {
  diagnostics.delete(uri);
  version += 1;
  if (version === 1) {
    notify("textDocument/didOpen", { textDocument: { uri, languageId: "yaml", version, text } });
  } else {
    notify("textDocument/didChange", { textDocument: { uri, version }, contentChanges: [{ text }] });
  }
  const deadline = Date.now() + 15000;
  while (!diagnostics.has(uri) && Date.now() < deadline) {
    await new Promise((r) => {
      diagnosticWaiters.push(r);
      setTimeout(r, 500);
    });
  }
  return diagnostics.get(uri) || null;
}

const failures = [];
function expect(what, ok, detail) {
  console.log(`${ok ? "ok  " : "FAIL"} ${what}${detail ? `: ${detail}` : ""}`);
  if (!ok) failures.push(what);
}
function position(text, needle, offset = needle.length) {
  const index = text.indexOf(needle);
  if (index < 0) throw new Error(`${needle} not in the config`);
  const before = text.slice(0, index + offset).split("\n");
  return { line: before.length - 1, character: before[before.length - 1].length };
}
function labels(completion) {
  const items = Array.isArray(completion) ? completion : (completion && completion.items) || [];
  return items.map((i) => i.label);
}

(async () => {
  const root = path.dirname(config);
  await request("initialize", {
    processId: process.pid,
    rootUri: `file://${path.resolve(root, "..")}`,
    capabilities: {
      textDocument: {
        completion: { completionItem: { snippetSupport: true, documentationFormat: ["markdown", "plaintext"] } },
        hover: { contentFormat: ["markdown", "plaintext"] },
        publishDiagnostics: {},
      },
      workspace: { configuration: true },
    },
  });
  notify("initialized", {});
  notify("workspace/didChangeConfiguration", { settings });

  const shipped = fs.readFileSync(config, "utf8");
  // A document beside the shipped config, so the modeline's relative path resolves as it would.
  const uri = `file://${path.join(root, "editor-check.yaml")}`;
  console.log(`server: ${server}\nconfig: ${config}\nfirst line: ${shipped.split("\n")[0]}`);

  for (const name of fs.readdirSync(configs).filter((f) => f.endsWith(".yaml")).sort()) {
    const clean = await open(uri, fs.readFileSync(path.join(configs, name), "utf8"));
    expect(`no diagnostics on configs/${name} as shipped`, clean !== null && clean.length === 0, JSON.stringify(clean));
  }

  // Completion of a key in `model:` (a new line under `arch:`), and of `qk_norm`'s values.
  const withBlank = shipped.replace("  arch: seq2seq\n", "  arch: seq2seq\n  \n");
  await open(uri, withBlank);
  const keys = labels(await request("textDocument/completion", { textDocument: { uri }, position: position(withBlank, "  arch: seq2seq\n  ") }));
  // Keys the section already has are not offered again.
  expect("completes model keys", ["positions", "logn_attention", "n_kv_heads", "head_dim"].every((k) => keys.includes(k)) && !keys.includes("d_model"), keys.join(", "));
  // The values of `qk_norm:`, with its value erased as a user about to type one.
  const erased = shipped.replace("qk_norm: none", "qk_norm: ");
  await open(uri, erased);
  const values = labels(await request("textDocument/completion", { textDocument: { uri }, position: position(erased, "qk_norm: ") }));
  expect("completes qk_norm's values", ["none", "layernorm", "rmsnorm", "l2"].every((v) => values.includes(v)), values.join(", "));
  await open(uri, shipped);

  for (const [key, doc] of [["d_model", /Width of the residual stream/], ["label_smoothing", /Label smoothing/], ["qk_norm: none", /Plain scaled dot-product attention/]]) {
    const hover = await request("textDocument/hover", { textDocument: { uri }, position: position(shipped, key, key.length - 2) });
    const hoverText = JSON.stringify(hover && hover.contents) || "";
    expect(`hover on ${key} shows its documentation`, doc.test(hoverText), hoverText.slice(0, 140));
  }

  const broken = shipped
    .replace("qk_norm: none", "qk_norm: l3")
    .replace("  lr: 3.0e-3\n", "  lr: 3.0e-3\n  lrr: 1.0\n")
    .replace("dropout: 0.1", "dropout: 1.5")
    .replace("kind: embedded", "kind: text\n    path: corpus.txt");
  const found = (await open(uri, broken)) || [];
  const lines = found.map((d) => `line ${d.range.start.line + 1}: ${d.message.split("\n")[0]}`);
  console.log(lines.map((l) => `     ${l}`).join("\n"));
  const at = (needle) => found.some((d) => d.range.start.line === position(broken, needle).line);
  expect("flags the unknown value qk_norm: l3", at("qk_norm: l3"));
  expect("flags the unknown key lrr", at("lrr: 1.0"));
  expect("flags dropout: 1.5 (must be < 1)", at("dropout: 1.5"));
  expect("flags a text corpus with a seq2seq model (model.arch must be lm)", at("arch: seq2seq"));

  await request("shutdown", null);
  notify("exit", null);
  proc.kill();
  console.log(failures.length ? `${failures.length} expectation(s) failed` : "every expectation held");
  process.exit(failures.length ? 1 : 0);
})().catch((e) => {
  console.error(e);
  proc.kill();
  process.exit(1);
});
