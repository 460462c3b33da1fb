# Dashboard browser test (broker/ui, issue #20): Debian's headless-capable
# Chromium, driven by chromedp over its DevTools pipe.
need_apt chromium
