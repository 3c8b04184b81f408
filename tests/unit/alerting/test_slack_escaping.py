"""Slack text and blocks escaped (issue 40, E8): a metric, rule, sample or run text that holds
a mention (``<!channel>``, ``<@U1>``, ``<!subteam^S1>``), a disguised link
(``<https://evil.example|click here>``) or a backtick never reaches Slack as a control sequence,
in the fallback ``text`` (what notifications show) and in every block. The one Slack escaping
is rlmon.service.alerting.notify.slack_text."""

from __future__ import annotations

import re
from typing import Any

import pytest

from rlmon.service.alerting.engine import AlertEvent
from rlmon.service.alerting.notify.render import slack_body
from rlmon.service.alerting.notify.slack_text import code, link, mrkdwn

HOSTILE = ["<!channel>", "<!here|here>", "<@U024BE7LH>", "<!subteam^SAZ94GDB8>",
           "<https://evil.example|click here>", "x` <https://evil.example> `y",
           "`https://evil.example`", "a&lt;!channel&gt;", "<mailto:a@evil.example|mail>",
           "multi\nline`\n<!everyone>"]
PUBLIC = "https://rlmon.example.com"
DASHBOARD = "https://grafana.example.com/d/x?var-run=grpo"


def _event(text: str) -> AlertEvent:
    return AlertEvent(
        run="grpo-7b", role="actor", step=7, alert=f"Rule{text}", severity="critical",
        state="firing", metric=f"actor/{text}", value=2.5, summary=f"summary {text}",
        condition=f"{text} > 2", detail=f"detail {text}", cost_note=f"cost {text}",
        what_to_check=f"check {text}", stop=f"stop {text}",
        samples=((1.0, f"id{text}", f"payload {text}"),), samples_metric=f"m{text}")


def _texts(body: dict[str, Any]) -> list[str]:
    """Every string Slack reads as mrkdwn: the fallback text and the blocks' texts."""
    out = [body["text"]]
    for block in body["blocks"]:
        if block["type"] == "header":
            continue  # plain_text: shown as written
        if "text" in block:
            out.append(block["text"]["text"])
        out.extend(e["text"] for e in block.get("elements", ()))
    return out


_OURS = re.compile(r"<https://(rlmon|grafana)\.example\.com/[^<>|\s]*\|(Open in rlmon|Open run|"
                   r"Open dashboard)>")


@pytest.mark.parametrize("text", HOSTILE)
def test_no_mention_link_or_open_code_span_from_the_input(text: str) -> None:
    body = slack_body([_event(text)], DASHBOARD, "rlmon", public_url=PUBLIC)
    for field in _texts(body):
        without_ours = _OURS.sub("", field)
        assert "<" not in without_ours and ">" not in without_ours, field
        for line in without_ours.splitlines():
            assert line.count("`") % 2 == 0, line  # every code span closed where it began
        # the metric's code span holds the whole name, whatever it holds
        if field is body["blocks"][1]["text"]["text"]:
            assert code(f"actor/{text}") in field
    assert len(_OURS.findall(" ".join(_texts(body)))) == 3  # rlmon's own links intact


def test_the_fallback_text_is_escaped() -> None:
    body = slack_body([_event("<!channel> <https://evil.example|click here>")], None, "rlmon")
    assert "<!channel>" not in body["text"] and "&lt;!channel&gt;" in body["text"]
    assert "&lt;https://evil.example|click here&gt;" in body["text"]


def test_the_helpers() -> None:
    assert mrkdwn("<!channel> & <@U1>") == "&lt;!channel&gt; &amp; &lt;@U1&gt;"
    assert code("a`b\n<c>") == "`a\u02cbb &lt;c&gt;`"
    assert code("") == "` `"
    assert link("https://x.example/a|b>c", "Open <!here>") == \
        "<https://x.example/a%7Cb%3Ec|Open &lt;!here&gt;>"
