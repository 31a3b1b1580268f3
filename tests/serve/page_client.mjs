// The chat page of `k3run serve` in headless Chromium (driven by test_serve_page.py): open /, ask a
// question, wait for the streamed answer to finish, read it from the DOM, save a screenshot.
// argv: URL, question, screenshot path, chromium path. Prints one JSON document.
import { chromium } from "playwright-core";

const [url, question, shot, exe] = process.argv.slice(2);
const browser = await chromium.launch({ executablePath: exe, headless: true,
                                        args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"] });
const out = { requests: [] };
try {
  const page = await browser.newPage({ viewport: { width: 1000, height: 700 } });
  page.on("request", (r) => out.requests.push(r.url()));
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(url, { waitUntil: "load", timeout: 30000 });
  await page.waitForFunction(() => document.getElementById("model").textContent !== "…", null, { timeout: 30000 });
  out.model = await page.textContent("#model");
  await page.fill("#input", question);
  await page.click("#send");
  // the stop button is enabled while the answer streams; the box gets data-done when it is complete
  await page.waitForSelector(".assistant[data-done='1']", { timeout: 120000 });
  out.reasoning = await page.textContent(".assistant details div");
  out.content = await page.textContent(".assistant .content");
  out.meta = await page.textContent(".assistant .meta");
  out.user = await page.textContent(".user");
  out.errors = errors;
  // the thinking switch off: a second question answers without reasoning
  await page.uncheck("#think");
  await page.fill("#input", question);
  await page.press("#input", "Enter");
  await page.waitForFunction(() => document.querySelectorAll(".assistant[data-done='1']").length === 2, null,
                             { timeout: 120000 });
  out.second = await page.$$eval(".assistant", (els) => ({ content: els[1].querySelector(".content").textContent,
                                                          folded: els[1].querySelector("details").hidden,
                                                          meta: els[1].querySelector(".meta").textContent }));
  await page.screenshot({ path: shot, fullPage: true });
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
