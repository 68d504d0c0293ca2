// The official JS SDK (@typesafe-ai/sdk 0.6.x), unmodified, against a running clef-tt.
// Usage: node tests/clients/js_sdk.mjs http://127.0.0.1:PORT  (with the package installed
// next to it or on NODE_PATH). Prints "N passed, 0 failed"; exits non-zero on failure.
import { TypeSafeClient } from "@typesafe-ai/sdk";
import assert from "node:assert/strict";

const client = new TypeSafeClient({ apiKey: "any-key", baseURL: process.argv[2], maxRetries: 0 });
let checks = 0;

const models = await client.models.list();
assert.ok(Array.isArray(models) ? models.length > 0 : models.models.length > 0, "models.list() is empty");
checks += 1;

const { answers, usage } = await client.systemOne({
  model: "clef",
  state: { message: "Our checkout started returning errors and orders are blocked." },
  questions: {
    department: {
      type: "choice",
      instructions: "Which team should handle the message?",
      criteria: { billing: "Payments or invoices", technical: "Bugs or outages" },
    },
    urgency: { type: "score", instructions: "How urgent is it?", criteria: ["Can wait", "This week", "Today"] },
    outage: { type: "noul", instructions: "Is a service down?" },
  },
});
assert.ok(["billing", "technical"].includes(answers.department.choice));
const total = Object.values(answers.department.probabilities).reduce((a, b) => a + b, 0);
assert.ok(Math.abs(total - 1) < 2e-4, `probabilities sum to ${total}`);
assert.equal(Object.keys(answers.urgency.legend).length, 3);
assert.ok(answers.outage.noul >= 0 && answers.outage.noul <= 1);
assert.ok(usage.input_tokens > 0);
checks += 1;

let status = 0;
try {
  await client.systemOne({ model: "clef", state: "x", questions: { q: { type: "noul", instructions: "?" } }, truncate: "yes" });
} catch (e) {
  status = e.status;
}
assert.equal(status, 422, "an invalid field must come back as a 422 APIError");
checks += 1;

console.log(`js sdk: ${checks} passed, 0 failed`);
