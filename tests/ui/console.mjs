// Drives the approvals console in headless Chromium, as a person would:
// sign in with an admin token, find the held call, keep a screenshot, grant
// it with one click, and see the list empty. Prints one JSON line (the
// cookies the browser holds and what the page showed) for the Rust test
// (tests/it/console.rs) to check.
//
//   node tests/ui/console.mjs BASE_URL ADMIN_TOKEN TOOL SCREENSHOT.png
import { chromium } from 'playwright-core';

const [base, token, tool, screenshot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  await page.goto(`${base}/ui`);
  // Not signed in: the console sends the browser to its sign-in form.
  const signIn = page.url();
  await page.fill('input[name=token]', token);
  await Promise.all([page.waitForURL(`${base}/ui`), page.click('button[type=submit]')]);
  const row = page.locator('#pending tr', { hasText: tool });
  await row.waitFor();
  const rowText = await row.innerText();
  await page.screenshot({ path: screenshot, fullPage: true });
  await Promise.all([page.waitForLoadState('load'), row.locator('button.grant').click()]);
  await page.locator('#none').waitFor();
  const cookies = await page.context().cookies();
  const scripts = await page.evaluate(() => document.scripts.length);
  console.log(JSON.stringify({ signIn, rowText, cookies, scripts }));
} finally {
  await browser.close();
}
