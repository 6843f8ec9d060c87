// The official TypeScript MCP client (the SDK the MCP Inspector ships) against a stdio server.
// stdin: {"sdk": "<path of @modelcontextprotocol/sdk>", "command": "...", "args": [...], "env": {...},
//         "calls": [{"name": "...", "arguments": {...}}, ...]}
// stdout: one JSON list, per call {"result": CallToolResult} or {"thrown": "the client's error message"}.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const job = JSON.parse(readFileSync(0, "utf8"));
const load = (rel) => import(pathToFileURL(join(job.sdk, "dist", "esm", rel)).href);
const { Client } = await load("client/index.js");
const { StdioClientTransport } = await load("client/stdio.js");

const client = new Client({ name: "tinycontext-test", version: "0" });
await client.connect(new StdioClientTransport({ command: job.command, args: job.args, env: job.env, stderr: "inherit" }));
await client.listTools(); // caches each tool's outputSchema validator, as hosts do
const out = [];
for (const call of job.calls) {
  try {
    out.push({ result: await client.callTool({ name: call.name, arguments: call.arguments }) });
  } catch (error) {
    out.push({ thrown: String(error && error.message ? error.message : error) });
  }
}
await client.close();
process.stdout.write(JSON.stringify(out));
