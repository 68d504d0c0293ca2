// The demo page (demo/, served at `/`) in headless Chromium, driven by playwright-core, against
// a `clef-tt serve` started with an API key: the page reports a missing key readably, then runs
// the presets with the key; every rendered probability must equal the API's own answer to the
// request the page sent; the repeated-state preset must show a prefix cache hit; bad input shows
// readable errors; replay counts accuracy; an attached image is sent as a data URL and answered
// as the API answers the same request.
// Usage: node demo_page.mjs BASE_URL API_KEY SCREENSHOT MEDIA_REQUESTS (goldens-media/requests.jsonl)
import { chromium } from "playwright-core";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

const [base, key, screenshot, mediaRequests] = process.argv.slice(2);
if (!base || !key || !screenshot || !mediaRequests) {
  console.error("usage: node demo_page.mjs BASE_URL API_KEY SCREENSHOT.(png|jpg) MEDIA_REQUESTS.jsonl");
  process.exit(2);
}

async function api(request) {
  const resp = await fetch(`${base}/v1/systemone`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify(request),
  });
  assert.equal(resp.status, 200, await resp.clone().text());
  return resp.json();
}

// Run the Ask panel once; returns the request the page sent (its preview) after answers render.
async function decideOnPage(page) {
  const before = await page.locator("#meta [data-role=request-id] b").textContent().catch(() => "");
  await page.click("#run");
  await page.waitForFunction(
    (prev) => {
      const id = document.querySelector("#meta [data-role=request-id] b");
      return (id && id.textContent !== prev) || !document.getElementById("error").hidden;
    },
    before,
    { timeout: 120_000 },
  );
  assert.equal(await page.locator("#error").isHidden(), true, await page.locator("#error").textContent());
  return JSON.parse(await page.locator("#request-preview").textContent());
}

// Every bar on the page equals the API's probability for the same request.
async function checkAgainstApi(page, request) {
  const reference = await api(request);
  const bars = await page.$$eval(".bar-row", (rows) =>
    rows.map((r) => ({ q: r.dataset.question, o: r.dataset.option, p: Number(r.dataset.probability) })),
  );
  let checked = 0;
  for (const [q, a] of Object.entries(reference.answers)) {
    const expected = a.type === "noul" ? { true: a.noul } : a.probabilities;
    for (const [option, p] of Object.entries(expected)) {
      const shown = bars.find((b) => b.q === q && b.o === option);
      assert.ok(shown, `no bar for ${q}/${option}`);
      assert.equal(shown.p, p, `${q}/${option}: page ${shown.p}, API ${p}`);
      checked++;
    }
    const result = await page.locator(`.answer[data-question="${q}"] [data-role=result]`).textContent();
    if (a.type === "choice") assert.ok(result.startsWith(a.choice), `${q}: ${result}`);
    if (a.type === "score") assert.ok(result.includes(a.score.toFixed(4)), `${q}: ${result}`);
  }
  const tokens = await page.locator("#meta [data-role=tokens] b").textContent();
  assert.equal(Number(tokens), reference.usage.input_tokens);
  return checked;
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  await page.goto(base);
  await page.waitForFunction(() => /API key needed|workers/.test(document.getElementById("server-status").textContent));

  // Without the key: a readable 401.
  await page.click("[data-preset=triage]");
  await page.click("#run");
  await page.waitForSelector("#error:not([hidden])");
  const unauthorised = await page.locator("#error").textContent();
  assert.match(unauthorised, /HTTP 401/);
  assert.match(unauthorised, /API key/);

  // With the key: the triage preset, bar for bar equal to the API.
  await page.fill("#api-key", key);
  await page.dispatchEvent("#api-key", "change");
  await page.waitForFunction(() => /workers/.test(document.getElementById("server-status").textContent));
  const triage = await decideOnPage(page);
  assert.deepEqual(Object.keys(triage.questions), ["team", "urgency", "outage"]);
  assert.equal(typeof triage.state, "string");
  let bars = await checkAgainstApi(page, triage);

  // An image attached to the state (a PNG of the media goldens) goes out as a data URL.
  const golden = readFileSync(mediaRequests, "utf8")
    .split("\n")
    .filter(Boolean)
    .map((l) => JSON.parse(l))
    .find((r) => r.id === "img_333x217_gradient_shapes");
  const dataUrl = JSON.parse(golden.body).images[0];
  assert.ok(dataUrl.startsWith("data:image/png;base64,"));
  const png = Buffer.from(dataUrl.split(",")[1], "base64");
  await page.setInputFiles("#images", { name: "shapes.png", mimeType: "image/png", buffer: png });
  await page.waitForSelector("#image-thumbs img");
  const withImage = await decideOnPage(page);
  assert.match(withImage.images[0], /^data:image\/png;base64,… \(\d+ characters\)$/);
  const sent = { ...withImage, images: [dataUrl] };
  bars += await checkAgainstApi(page, sent);
  const textOnly = await api(triage);
  const imageAnswer = await api(sent);
  assert.ok(imageAnswer.usage.input_tokens > textOnly.usage.input_tokens + 60, "the image's tokens count");
  await page.click("#clear-images");
  assert.equal(await page.locator("#image-thumbs img").count(), 0);

  // The invoice preset sends a JSON object as the state.
  await page.click("[data-preset=invoice]");
  const invoice = await decideOnPage(page);
  assert.equal(invoice.state.invoice_id, "INV-2041");
  bars += await checkAgainstApi(page, invoice);

  // The repeated state: the second run is a prefix cache hit, and the counters say so.
  await page.click("[data-preset=repeated]");
  await decideOnPage(page);
  const hitsBefore = Number(await page.locator("#cache").getAttribute("data-hits"));
  const repeated = await decideOnPage(page);
  assert.equal(await page.locator("#meta [data-role=cache] b").textContent(), "hit");
  await page.waitForFunction((n) => Number(document.getElementById("cache").dataset.hits) > n, hitsBefore);
  bars += await checkAgainstApi(page, repeated);
  await page.screenshot({ path: screenshot, fullPage: true, ...(/\.jpe?g$/.test(screenshot) ? { quality: 50 } : {}) });

  // Bad input: invalid JSON state (caught on the page), an empty choice (the server's 422).
  await page.click("[data-preset=invoice]");
  await page.fill("#state", "{not json");
  await page.click("#run");
  await page.waitForSelector("#error:not([hidden])");
  assert.match(await page.locator("#error").textContent(), /not valid JSON/);
  await page.click("[data-preset=triage]");
  await page.fill(".question:first-child .q-criteria", "");
  await page.click("#run");
  await page.waitForFunction(() => /HTTP 422/.test(document.getElementById("error").textContent));
  const invalid = await page.locator("#error").textContent();
  assert.match(invalid, /questions › team/, invalid);

  // Replay: two records labelled with the API's own answers, one deliberately wrong, one bad line.
  const answer = (await api(triage)).answers;
  const invoiceAnswer = (await api(invoice)).answers;
  const wrongTeam = Object.keys(triage.questions.team.criteria).find((o) => o !== answer.team.choice);
  const records = [
    { request: triage, expected: { team: answer.team.choice, outage: answer.outage.noul >= 0.5 } },
    { request: invoice, expected: { duplicate: invoiceAnswer.duplicate.noul >= 0.5 } },
    { request: triage, expected: { team: wrongTeam } },
  ];
  const jsonl = records.map((r) => JSON.stringify(r)).join("\n") + "\nthis line is not JSON\n";
  await page.click("#tab-replay");
  await page.fill("#replay-text", jsonl);
  await page.click("#replay-run");
  await page.waitForFunction(() => /^4\/4 records/.test(document.getElementById("replay-accuracy").textContent), null, {
    timeout: 120_000,
  });
  const acc = await page.locator("#replay-accuracy").evaluate((e) => ({ ...e.dataset }));
  assert.deepEqual(acc, { correct: "3", total: "4", failed: "1" });

  assert.deepEqual(pageErrors, []);
  console.log(`demo page: ${bars} probabilities equal to the API's (one request with an image), cache hit shown, errors readable, replay 3/4 + 1 failed line`);
} finally {
  await browser.close();
}
