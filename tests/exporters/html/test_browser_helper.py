"""tests/support/browser.py: the page it opens reports console errors and blocks the network."""

from __future__ import annotations


def test_console_errors_and_exceptions_are_collected(open_page, tmp_path):
    page = tmp_path / "p.html"
    page.write_text(
        "<html><body><script>console.error('boom'); console.log('fine');</script>"
        "<script>undefinedFunction()</script></body></html>"
    )
    view = open_page(page)
    assert view.errors[0] == "boom"
    assert len(view.errors) == 2 and "undefinedFunction" in view.errors[1]


def test_network_requests_are_blocked_and_listed(open_page, tmp_path):
    page = tmp_path / "p.html"
    page.write_text(
        '<html><body><img src="https://example.com/x.png">'
        '<script src="http://fonts.example.org/f.js"></script>ok</body></html>'
    )
    view = open_page(page)
    assert sorted(view.blocked) == ["http://fonts.example.org/f.js", "https://example.com/x.png"]
    assert view.page.inner_text("body") == "ok"
