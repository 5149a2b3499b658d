"""The chat page at / used as a user and as an attacker would, in real headless Chromium: most
tests talk to a scripted stand-in for the server (exact bytes, chunk boundaries and errors on
cue), the rest to a real `moepack serve`."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from browser import Browser, browser_or_skip
from moepack.serve.page_headers import page_headers
from serve_fixtures import demo_server

PAGE = Path(__file__).resolve().parents[1] / "serve" / "static" / "index.html"
pytestmark = [pytest.mark.network, pytest.mark.timeout(900)]


def sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def delta(text: str) -> bytes:
    return sse({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


class Scripted:
    """127.0.0.1 server: the real page (with page_headers) at /, a model list, and chat replies
    taken from `replies`: (status, [byte chunks]) each, the chunks written `gap` s apart, or
    (status, [byte chunks], content type) for a body that is not the API's."""

    def __init__(self, model: str = "scripted") -> None:
        self.model, self.replies, self.bodies, self.gap = model, [], [], 0.02
        self.hung_up = 0  # replies the page stopped reading before their end
        self.models_down = 0  # the next this many model lists fail (a proxy's 502 page)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/":
                    page = PAGE.read_bytes()
                    self.reply(200, [page], "text/html", page_headers(page))
                elif self.path == "/frame":  # another page (no policy of its own) framing it
                    self.reply(200, [b'<iframe id=f src="/" onload="window.__loaded=1">'],
                               "text/html")
                elif self.path == "/v1/models" and outer.models_down:
                    outer.models_down -= 1
                    self.reply(502, [b"<html>Bad Gateway</html>"], "text/html")
                elif self.path == "/v1/models":
                    self.reply(200, [json.dumps({"data": [{"id": outer.model}]}).encode()])
                else:
                    self.reply(404, [b"{}"])

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length", 0))
                outer.bodies.append(json.loads(self.rfile.read(n)))
                status, chunks, *ctype = outer.replies.pop(0)
                self.reply(status, chunks, ctype[0] if ctype else "text/event-stream"
                           if status == 200 else "application/json")

            def reply(self, status, chunks, ctype="application/json", headers=None) -> None:
                self.send_response(status)  # HTTP/1.0: the body ends when the socket closes
                self.send_header("Content-Type", ctype)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    for i, c in enumerate(chunks):
                        if i:
                            time.sleep(outer.gap)  # separate reads in the page
                        self.wfile.write(c)
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    outer.hung_up += 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def browser():
    yield from browser_or_skip()


@pytest.fixture
def scripted():
    s = Scripted()
    yield s
    s.close()


def open_page(b: Browser, url: str, model: str | None) -> None:
    """model: the name the page is to show, or None for a model list that failed to load."""
    b.call("Page.enable")
    b.call("Page.navigate", url=url + "/")
    label = "document.getElementById('model').textContent"
    b.wait_for("document.readyState === 'complete' && document.getElementById('model') && " +
               (f"{label} !== '…'" if model is None else f"{label} === {json.dumps(model)}"))
    # a policy violation anywhere in the page (the page's own code included) is recorded, and
    # so is every request body the page sends
    b.eval("window.__violations = []; document.addEventListener('securitypolicyviolation', "
           "(e) => window.__violations.push(e.violatedDirective)); window.__bodies = []; "
           "const fetch0 = window.fetch; window.fetch = (url, o) => { if (o && o.body) "
           "window.__bodies.push(JSON.parse(o.body)); return fetch0(url, o); }; true")


def send(b: Browser, text: str) -> None:
    b.eval("document.getElementById('input').focus(); true")
    b.call("Input.insertText", text=text)
    b.press_enter()


def click(b: Browser, element_id: str) -> None:
    """A real mouse click (it moves the focus, unlike element.click())."""
    r = b.eval(f"JSON.stringify(document.getElementById('{element_id}').getBoundingClientRect())")
    r = json.loads(r)
    for kind in ("mousePressed", "mouseReleased"):
        b.call("Input.dispatchMouseEvent", type=kind, x=r["x"] + r["width"] / 2,
               y=r["y"] + r["height"] / 2, button="left", clickCount=1)


def idle(b: Browser, timeout: float = 30) -> None:
    b.wait_for("document.getElementById('stop').disabled", timeout)


def test_page_headers_hash_every_inline_block():
    page = PAGE.read_bytes()
    h = page_headers(page)
    csp = dict(d.strip().split(" ", 1) for d in h["Content-Security-Policy"].split(";"))
    assert csp["default-src"] == "'none'" and csp["frame-ancestors"] == "'none'"
    assert "unsafe-inline" not in h["Content-Security-Policy"]
    assert csp["script-src"].count("sha256-") == page.count(b"<script")
    assert csp["style-src"].count("sha256-") == page.count(b"<style")
    assert h["X-Content-Type-Options"] == "nosniff"
    assert page_headers(page.replace(b"<script>", b"<script>1;"))[
        "Content-Security-Policy"] != h["Content-Security-Policy"]


def test_page_works_under_its_policy_and_markup_in_output_stays_text(browser, scripted):
    # markup wherever server text lands: model name, reply, error message
    evil = '<img src=x onerror="window.__pwned=1"><a href="javascript:window.__pwned=2">x</a>'
    scripted.model = evil
    scripted.replies = [(200, [delta("**bold** " + evil), delta("\n```\n" + evil + "\n```"),
                               sse({"error": {"message": evil, "code": "engine_error"}}),
                               sse(b"[DONE]")])]
    open_page(browser, scripted.url, evil)
    send(browser, evil)
    idle(browser)
    assert browser.eval("window.__pwned === undefined")
    assert browser.eval("document.querySelectorAll('#log img, #log a, header img').length") == 0
    assert evil in browser.eval("document.querySelector('.msg.assistant').textContent")
    assert browser.eval("window.__violations") == []  # the page itself needs nothing blocked
    # markup injected by other means still cannot run script
    browser.eval("document.body.insertAdjacentHTML('beforeend', "
                 "'<img src=x onerror=\"window.__pwned=3\">'); true")
    browser.wait_for("window.__violations.includes('script-src-attr')", 10)
    assert browser.eval("window.__pwned === undefined")
    # and no other page can frame it (an error page, not the chat, loads in the frame)
    browser.call("Page.navigate", url=scripted.url + "/frame")
    browser.wait_for("window.__loaded === 1", 10)
    assert browser.eval("document.getElementById('f').contentDocument === null")


def test_a_refused_message_leaves_the_conversation(browser):
    srv = demo_server()
    open_page(browser, srv.url, "demo")
    long = "x " * 20000  # over the demo's 1024-token context: 400 context_length_exceeded
    send(browser, long)
    idle(browser)
    assert browser.eval("document.querySelector('.msg.assistant').classList.contains('error')")
    assert browser.eval("document.getElementById('input').value") == long  # to edit
    browser.eval("document.getElementById('input').value = ''; true")
    send(browser, "hi")
    idle(browser)
    assert browser.eval("window.__bodies[1].messages") == [{"role": "user", "content": "hi"}]
    assert not browser.eval("document.querySelectorAll('.msg.assistant')[1].classList"
                            ".contains('error')")


def test_new_chat_mid_reply_stops_it_and_starts_empty(browser, scripted):
    scripted.replies = [(200, [delta("w ")] * 500 + [sse(b"[DONE]")]),
                        (200, [delta("ok"), sse(b"[DONE]")])]
    open_page(browser, scripted.url, "scripted")
    send(browser, "first")
    browser.wait_for("(document.querySelector('.msg.assistant') || {}).textContent")
    browser.eval("document.getElementById('clear').click(); true")
    idle(browser)
    send(browser, "second")
    idle(browser)
    assert browser.eval("window.__bodies[1].messages") == [{"role": "user", "content": "second"}]
    assert browser.eval("document.querySelectorAll('.msg').length") == 2  # only the new chat
    deadline = time.monotonic() + 10  # the old reply's request was dropped, not read to its end
    while scripted.hung_up < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scripted.hung_up == 1


def test_focus_stays_in_the_input_after_clicking_send_and_stop(browser, scripted):
    scripted.replies = [(200, [delta("a"), sse(b"[DONE]")]),
                        (200, [delta("w ")] * 500 + [sse(b"[DONE]")])]
    open_page(browser, scripted.url, "scripted")
    focused = "document.activeElement.id"
    for _ in range(2):
        browser.eval("document.getElementById('input').value = 'q'; true")
        click(browser, "send")
        browser.wait_for("(document.querySelectorAll('.msg.assistant')[window.__bodies.length"
                         " - 1] || {}).textContent")
        assert browser.eval(focused) == "input"
    click(browser, "stop")
    idle(browser)
    assert browser.eval(focused) == "input"


def test_right_to_left_text_is_shown_right_to_left(browser, scripted):
    scripted.replies = [(200, [delta("שלום, עולם!"), sse(b"[DONE]")]),
                        (200, [delta("hello, world!"), sse(b"[DONE]")])]
    open_page(browser, scripted.url, "scripted")
    send(browser, "مرحبا بالعالم")
    idle(browser)
    send(browser, "hi")
    idle(browser)
    dirs = browser.eval("[...document.querySelectorAll('.msg')]"
                        ".map((m) => getComputedStyle(m).direction)")
    assert dirs == ["rtl", "rtl", "ltr", "ltr"]


def test_a_long_fast_reply_keeps_up(browser, scripted):
    # 20000 tokens as they come from a fast model: many per read
    burst = b"".join(delta(f"{i} ") for i in range(1000))
    scripted.replies = [(200, [burst] * 20 + [sse(b"[DONE]")])]
    open_page(browser, scripted.url, "scripted")
    send(browser, "go")
    idle(browser, 20)  # redrawing the whole reply per token took minutes
    text = browser.eval("document.querySelector('.msg.assistant').textContent")
    assert text == "".join(f"{i} " for i in range(1000)) * 20


def test_scrolling_up_during_a_reply_is_not_undone(browser, scripted):
    scripted.replies = [(200, [delta("line\n" * 10)] * 100 + [sse(b"[DONE]")])]
    open_page(browser, scripted.url, "scripted")
    send(browser, "go")
    log = "document.getElementById('log')"
    # it follows the reply while the view is at the bottom
    browser.wait_for(f"{log}.scrollTop > 0 && {log}.scrollHeight > 3 * {log}.clientHeight")
    browser.eval(f"{log}.scrollTop = 0; window.__at = {log}.scrollHeight; true")
    browser.wait_for(f"{log}.scrollHeight > window.__at + 500")  # more came
    idle(browser)
    assert browser.eval(f"{log}.scrollTop") == 0


def test_enter_while_composing_with_an_ime_does_not_send(browser, scripted):
    scripted.replies = [(200, [delta("ok"), sse(b"[DONE]")])]
    open_page(browser, scripted.url, "scripted")
    browser.eval("document.getElementById('input').focus(); true")
    # an IME's Enter picks a candidate: Chromium marks its keydown as composing (keyCode 229)
    browser.call("Input.imeSetComposition", text="nihao", selectionStart=5, selectionEnd=5)
    browser.press_enter(types=False)
    # Safari sends the Enter that ends a composition after compositionend, with only keyCode 229
    browser.eval("document.getElementById('input').dispatchEvent(new KeyboardEvent('keydown', "
                 "{key: 'Enter', keyCode: 229, bubbles: true, cancelable: true})); true")
    time.sleep(0.3)
    assert browser.eval("window.__bodies") == []
    assert browser.eval("document.querySelectorAll('.msg').length") == 0
    browser.call("Input.insertText", text="你好")  # commits the composition
    browser.press_enter()
    idle(browser)
    assert browser.eval("window.__bodies[0].messages") == [{"role": "user", "content": "你好"}]


def test_an_error_that_is_not_json_shows_its_status_and_the_page_goes_on(browser, scripted):
    scripted.replies = [
        (502, [b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"],
         "text/html"),
        (500, []),
        (503, [b"upstream overloaded\nretry in 30 s\n"], "text/plain"),
        (200, [delta("ok"), sse(b"[DONE]")])]
    open_page(browser, scripted.url, "scripted")
    send(browser, "q")
    shown = []
    for _ in range(4):
        idle(browser)
        shown.append(browser.eval("document.querySelectorAll('.msg.assistant')"
                                  "[window.__bodies.length - 1].textContent"))
        if len(shown) < 4:  # the failed message is back in the input: Enter sends it again
            assert browser.eval("document.getElementById('input').value") == "q"
            browser.press_enter()
    html, empty, plain, ok = shown
    assert "502" in html and "Bad Gateway" in html and "<" not in html and "JSON" not in html
    assert "500" in empty and "JSON" not in empty
    assert "503" in plain and "upstream overloaded" in plain and "retry" not in plain
    assert ok == "ok"
    assert [b["messages"] for b in browser.eval("window.__bodies")] == [
        [{"role": "user", "content": "q"}]] * 4


def test_controls_have_names_and_the_conversation_is_a_live_log(browser, scripted):
    open_page(browser, scripted.url, "scripted")
    nodes = [n for n in browser.call("Accessibility.getFullAXTree")["nodes"]
             if not n.get("ignored")]
    controls = [n for n in nodes if n["role"]["value"] in ("button", "textbox", "spinbutton")]
    assert len(controls) == 7  # 3 buttons, message, max tokens, temperature, API key
    for n in controls:
        # a placeholder is no label: it is gone once typing starts
        used = [s for s in n["name"].get("sources", []) if "value" in s and
                not s.get("superseded")]
        assert n["name"]["value"].strip() and used[0]["type"] != "placeholder", n
    log = [n for n in nodes if n["role"]["value"] == "log"]
    assert len(log) == 1
    assert {"name": "live", "value": {"type": "token", "value": "polite"}} in log[0]["properties"]
    node = browser.call("DOM.describeNode", backendNodeId=log[0]["backendDOMNodeId"])["node"]
    assert node["attributes"][node["attributes"].index("id") + 1] == "log"


def test_the_log_is_busy_while_a_reply_streams(browser, scripted):
    """aria-busy while the reply streams, so that a screen reader reads it once when whole,
    not piece by piece from the polite live log; cleared when it ends."""
    scripted.replies = [(200, [delta("a"), delta("b"), delta("c"), sse(b"[DONE]")])]
    scripted.gap = 0.5
    open_page(browser, scripted.url, "scripted")
    send(browser, "q")
    browser.wait_for("(document.querySelector('.msg.assistant') || {}).textContent === 'a'")
    assert browser.eval("document.getElementById('log').getAttribute('aria-busy')") == "true"
    idle(browser)
    assert browser.eval("document.getElementById('log').getAttribute('aria-busy')") is None


def test_a_message_is_sent_as_typed_and_blank_ones_are_not_sent(browser, scripted):
    scripted.replies = [(200, [delta("ok"), sse(b"[DONE]")])]
    open_page(browser, scripted.url, "scripted")
    send(browser, " \n\t ")
    time.sleep(0.3)
    assert browser.eval("window.__bodies") == []
    assert browser.eval("document.querySelectorAll('.msg').length") == 0
    code = "    for x in xs:\n        print(x)\n"  # pasted from inside a function
    browser.eval(f"document.getElementById('input').value = {json.dumps(code)}; true")
    browser.press_enter()
    idle(browser)
    assert browser.eval("window.__bodies[0].messages") == [{"role": "user", "content": code}]
    assert browser.eval("document.querySelector('.msg.user').textContent") == code


def test_a_model_list_that_failed_is_not_sent_as_the_model_and_is_loaded_again(browser,
                                                                              scripted):
    scripted.replies = [(200, [delta("ok"), sse(b"[DONE]")])] * 3
    scripted.models_down = 2  # the first load and the first retry fail
    open_page(browser, scripted.url, None)
    send(browser, "q")
    idle(browser)
    assert "model" not in browser.eval("window.__bodies[0]")  # not the failure's text
    browser.wait_for("document.getElementById('model').textContent === 'scripted'", 10)
    send(browser, "r")
    idle(browser)
    assert browser.eval("window.__bodies[1].model") == "scripted"
    # a list that fails later (a new API key reloads it) leaves the last id known in use
    scripted.models_down = 100
    browser.eval("const k = document.getElementById('key'); k.value = 'k2';"
                 "k.dispatchEvent(new Event('change')); true")
    browser.wait_for("document.getElementById('model').textContent !== 'scripted'", 10)
    send(browser, "s")
    idle(browser)
    assert browser.eval("window.__bodies[2].model") == "scripted"
