// Drives the idem console in Debian's chromium (playwright-core, no
// downloaded browser). Run by cmd/idem/e2e/console_browser_test.go, which
// starts `idem serve --provider --console-addr` with payments suspended
// after their first step, and passes:
//
//   CONSOLE_URL      the console's base URL
//   CONSOLE_TOKEN    the token of --console-token-file
//   SUSPENDED_KEY    the Idempotency-Key of a suspended payment
//   MARKUP_KEY       the Idempotency-Key, holding markup, of a completed
//                    payment
//   SCREENSHOT_DIR   where to write the overview's and the record's
//                    screenshots (optional)
//
// Each step prints one line; any failed expectation exits with status 1.
import { chromium } from "playwright-core";

const base = process.env.CONSOLE_URL;
const token = process.env.CONSOLE_TOKEN;
const key = process.env.SUSPENDED_KEY;
const markupKey = process.env.MARKUP_KEY;
const shots = process.env.SCREENSHOT_DIR || "";

function check(cond, what) {
  if (!cond) throw new Error("expectation failed: " + what);
  console.log("ok: " + what);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run"],
});
let failed = false;
try {
  const context = await browser.newContext({ viewport: { width: 1200, height: 900 } });
  const page = await context.newPage();
  const violations = [];
  // Content-Security-Policy violations and script errors; the 401s and
  // 404s this test provokes on purpose are not counted.
  page.on("console", (m) => {
    if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) violations.push(m.text());
  });
  page.on("pageerror", (e) => violations.push(String(e)));
  let dialogs = 0; // an alert() would mean markup from a key ran
  page.on("dialog", async (d) => { dialogs++; await d.dismiss(); });
  page.setDefaultTimeout(15000);

  // The token is required, and a wrong one is refused.
  let resp = await page.goto(base + "/");
  check(resp.status() === 401, "the overview without the token answers 401");
  await page.fill("#token", "this-is-not-the-token");
  await page.click("#login");
  const refusal = await page.textContent("#error");
  check(refusal.includes("Wrong token"), `a wrong token is refused (${refusal})`);
  check(!(await context.cookies()).some((c) => c.name === "idem_console"), "no session cookie after a wrong token");
  resp = await page.goto(base + "/records");
  check(resp.status() === 401, "still no page after a wrong token");

  await page.fill("#token", token);
  await Promise.all([page.waitForURL(base + "/records"), page.click("#login")]);
  const cookie = (await context.cookies()).find((c) => c.name === "idem_console");
  check(cookie && cookie.httpOnly && cookie.sameSite === "Strict", "the right token sets an HttpOnly, SameSite=Strict cookie");

  // The overview counts the suspended payments.
  await page.goto(base + "/");
  const suspended = Number(await page.textContent("#count-suspended"));
  check(suspended >= 1, `the overview counts ${suspended} suspended payments`);
  await page.waitForSelector("#rates");
  if (shots) await page.screenshot({ path: shots + "/console-overview.png", fullPage: true });

  // Find one by its key: the key goes in the form, not the URL.
  await page.fill("#search-key", key);
  await Promise.all([page.waitForURL(/\/records\/[0-9a-f]{64}$/), page.click("#search-go")]);
  const recordURL = page.url();
  check(!recordURL.includes(key), "the record's URL does not hold the key");
  check((await page.textContent("#key")) === key, "the record page shows the key");
  check((await page.textContent("#state")).includes("suspended after a step"), "the payment is suspended after a step");
  const steps = await page.$$eval("#steps tbody tr", (rows) => rows.map((r) => [...r.cells].map((c) => c.textContent.trim())));
  check(steps.length === 2 && steps[0][0] === "payment" && steps[0][1] === "done", "step payment is done");
  check(steps[1][0] === "charge" && steps[1][1] !== "done", `step charge is not done (${steps[1][1]})`);
  check(steps.every((s) => /^idem-[A-Za-z0-9_-]{43}$/.test(s[2])), "every step shows its derived downstream key");
  if (shots) await page.screenshot({ path: shots + "/console-record.png", fullPage: true });

  // Reconcile it, after confirming.
  await Promise.all([page.waitForURL(recordURL + "/reconcile"), page.click("#action-reconcile")]);
  check((await page.textContent("#confirm-title")).includes("Reconcile"), "reconciling asks for a confirmation");
  await Promise.all([page.waitForURL(recordURL + "?done=reconciled", { timeout: 60000 }), page.click("#confirm")]);
  check((await page.textContent("#state")).trim() === "completed", "the reconciled payment is completed");
  check((await page.textContent("#status")).startsWith("201"), "its stored response is the 201");

  // Delete the completed record: cancelling the confirmation keeps it.
  await Promise.all([page.waitForURL(recordURL + "/delete"), page.click("#action-delete")]);
  check((await page.textContent("#confirm-title")).includes("Delete"), "deleting asks for a confirmation");
  await Promise.all([page.waitForURL(recordURL), page.click("#cancel")]);
  check((await page.textContent("#state")).trim() === "completed", "cancelling keeps the record");
  await Promise.all([page.waitForURL(recordURL + "/delete"), page.click("#action-delete")]);
  await page.click("#confirm");
  check((await page.textContent("#done")).includes("deleted"), "the confirmed delete deletes the record");
  resp = await page.goto(recordURL);
  check(resp.status() === 404, "the deleted record's page answers 404");

  // The state filter offers the held records (reconciliation gave up).
  await page.goto(base + "/records");
  const states = await page.$$eval("#filter-state option", (os) => os.map((o) => o.value));
  check(states.includes("held"), "the state filter offers held");
  await page.selectOption("#filter-state", "held");
  await Promise.all([page.waitForURL(/state=held/), page.click("#filter-go")]);
  check((await page.textContent(".pager")).includes("End of the list"), "no payment is held here");

  // A key holding markup shows as text, and runs nothing.
  await page.fill("#search-key", markupKey);
  await Promise.all([page.waitForURL(/\/records\/[0-9a-f]{64}$/), page.click("#search-go")]);
  const markupURL = page.url();
  check((await page.textContent("#key")) === markupKey, "a key holding markup shows as text");
  check((await page.$$("main script")).length === 0, "the key added no script element");

  // Its delete confirmed in two tabs and sent from both at once: one
  // deletes, the other says that nothing was done.
  const tab2 = await context.newPage();
  tab2.on("dialog", async (d) => { dialogs++; await d.dismiss(); });
  await Promise.all([page.waitForURL(markupURL + "/delete"), page.click("#action-delete")]);
  await tab2.goto(markupURL + "/delete");
  await Promise.all([page.click("#confirm"), tab2.click("#confirm")]);
  await Promise.all([page.waitForSelector("#done, #error"), tab2.waitForSelector("#done, #error")]);
  const outcomes = [await page.textContent("main"), await tab2.textContent("main")];
  const deleted = outcomes.filter((t) => t.includes("The record was deleted")).length;
  const refused = outcomes.filter((t) => t.includes("409") && t.includes("nothing was done")).length;
  check(deleted === 1 && refused === 1, `two tabs: one delete done, one 409 (${outcomes.map((t) => t.trim().slice(0, 80)).join(" | ")})`);
  check(dialogs === 0, "no dialog opened");

  check(violations.length === 0, "no script error nor Content-Security-Policy violation: " + violations.join("; "));
} catch (e) {
  failed = true;
  console.error(e.stack || String(e));
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
