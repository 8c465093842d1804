"""The accessibility tree's XML (guirl/vmpool/server/atspi_walk.py) stays well-formed whatever an
application exposes: names that are no XML names, control characters, U+FFFC placeholders, an application
that fails mid-walk. The walk over a real AT-SPI desktop is tested against OSWorld's own server
(tests/contract/test_osworld_server.py); here the accessibles are plain objects with pyatspi's interface."""

from __future__ import annotations

import types

import lxml.etree

from guirl.vmpool.server.atspi_walk import NS, Walker, to_xml


class Node:
    def __init__(
        self, role: str, name: str = "", *, text: str | None = None, attrs=None, children=(), fail=False
    ):
        self.role, self.name, self.text, self.attrs = role, name, text, attrs or {}
        self.children, self.fail = list(children), fail

    def getState(self):  # noqa: N802 (pyatspi's names)
        return types.SimpleNamespace(get_states=lambda: [1, 2], contains=lambda s: True)

    def get_attributes(self):
        return self.attrs

    def getRoleName(self):  # noqa: N802
        return self.role

    def queryComponent(self):  # noqa: N802
        return types.SimpleNamespace(getExtents=lambda _kind: (1, 2, 30, 40))

    def queryText(self):  # noqa: N802
        if self.text is None:
            raise NotImplementedError
        return types.SimpleNamespace(characterCount=len(self.text), getText=lambda a, b: self.text[a:b])

    def queryImage(self):  # noqa: N802
        raise NotImplementedError

    querySelection = queryValue = queryAction = queryImage  # noqa: N815

    def __iter__(self):
        for child in self.children:
            if child == "boom":
                raise RuntimeError("the application went away")
            yield child


PYATSPI = types.SimpleNamespace(
    StateType=types.SimpleNamespace(_enum_lookup={1: "STATE_SHOWING", 2: "STATE_VISIBLE"}),
    XY_SCREEN=0,
    STATE_SHOWING=1,
    STATE_ACTIVE=3,
    Registry=None,
)


def test_what_an_application_exposes_cannot_break_the_xml() -> None:
    app = Node(
        "application",
        "odd\x01app",
        attrs={"toolkit": "gtk", "bad key": "x", "1st": "y", "key\n": "z", "ok.key-2": "tab\there\x0b"},
        children=[
            Node("push button", "Save"),
            Node("", "", text="a\ufffcb\ufffdc\x00d"),
            Node("text", "", text="first"),
            "boom",  # the rest of this node's children cannot be read: the ones read stay
        ],
    )
    desktop = Node("desktop frame", children=[app])
    PYATSPI.Registry = types.SimpleNamespace(getDesktop=lambda _i: desktop)
    xml = to_xml(Walker(PYATSPI).tree())
    root = lxml.etree.fromstring(xml.encode())
    assert root.tag == "desktop-frame" and dict(root.attrib) == {} and root.nsmap == NS
    (app_el,) = root
    attr = NS["attr"]
    assert app_el.get("name") == "oddapp" and app_el.get(f"{{{attr}}}toolkit") == "gtk"
    assert app_el.get(f"{{{attr}}}ok.key-2") == "tab\there"
    assert [k for k in app_el.attrib if k.startswith(f"{{{attr}}}")] == [
        f"{{{attr}}}toolkit",
        f"{{{attr}}}ok.key-2",
    ]
    assert [c.tag for c in app_el] == ["push-button", "unknown", "text"]
    assert app_el[1].text == "abcd" and app_el[2].text == "first"
    assert app_el[0].get(f"{{{NS['st']}}}showing") == "true"
    assert (
        app_el[0].get(f"{{{NS['cp']}}}screencoord") == "(1, 2)"
        and app_el[0].get(f"{{{NS['cp']}}}size") == "(30, 40)"
    )


def test_an_empty_desktop_is_one_element_with_every_namespace() -> None:
    PYATSPI.Registry = types.SimpleNamespace(getDesktop=lambda _i: Node("desktop frame"))
    xml = to_xml(Walker(PYATSPI).tree())
    assert xml.startswith("<desktop-frame xmlns:") and xml.endswith(" />") and "  " not in xml
    assert lxml.etree.fromstring(xml.encode()).nsmap == NS
