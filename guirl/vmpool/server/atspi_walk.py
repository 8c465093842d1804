"""The desktop's accessibility tree through AT-SPI, in the XML shape of OSWorld's VM server (`/accessibility`
and `/terminal`), for guirl's local desktops.

This file runs as a helper process under the system's Python (Debian's `python3-pyatspi` is built for it,
not for whatever Python guirl runs on), so it imports only the standard library and pyatspi. It reads one
JSON request per line on stdin (`{"op": "tree"}` or `{"op": "terminal"}`) and writes one JSON answer per
line on stdout: `{"ok": true, "xml": ...}`, `{"ok": true, "output": ...}` or `{"ok": false, "error": ...}`.
Its first line says whether it can serve at all: `{"ready": true}`, or `{"ready": false, "error": ...}`.

The shape, as OSWorld's server writes it: the root `<desktop-frame>`, one element per accessible named by
its role (spaces as `-`; an empty role is `unknown`), `name` always; each state that is set as
`st:NAME="true"`; the object's attributes as `attr:KEY`; `cp:screencoord="(x, y)"` and `cp:size="(w, h)"`
for a visible and showing component (screen coordinates); the text as the element's text (without U+FFFC
and U+FFFD); `image="true"` and `selection="true"` for those interfaces; `val:value/min/max/step`;
`act:NAME_desc` and `act:NAME_kb` per action. At most 50 levels deep and 1024 children per node; in a
LibreOffice Calc sheet only the cells on screen (a sheet has millions). Unlike OSWorld's server, the
applications come in the registry's order (OSWorld's come in whichever order its threads finish), and a
node whose children cannot be read keeps the children read so far, as OSWorld's does.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

NS = {
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
    "doc": "https://accessibility.ubuntu.example.org/ns/document",
    "docattr": "https://accessibility.ubuntu.example.org/ns/document/attributes",
    "txt": "https://accessibility.ubuntu.example.org/ns/text",
    "val": "https://accessibility.ubuntu.example.org/ns/value",
    "act": "https://accessibility.ubuntu.example.org/ns/action",
}
"""OSWorld's namespaces for an Ubuntu desktop (its server declares all of them on the root)."""
MAX_DEPTH = 50
MAX_WIDTH = 1024
CALC_SCAN = 500
"""In a Calc sheet: columns scanned for the first cell on screen, and rows without one before giving up."""
TERMINAL_APP = "gnome-terminal-server"
"""The only terminal OSWorld's `/terminal` reads (GNOME Terminal's VTE widgets speak AT-SPI; xterm does
not)."""

_XML_NAME = re.compile(r"[A-Za-z_][\w.-]*")
"""What may name an element or attribute (matched whole: `fullmatch`)."""
_XML_BAD_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


class RegistryUnavailable(RuntimeError):
    """AT-SPI's registry (or the bus) did not answer: the desktop's fault, not an application's."""


for _prefix, _uri in NS.items():
    ET.register_namespace(_prefix, _uri)


def _clean(text: str) -> str:
    """`text` as XML can carry it (an application may expose control characters)."""
    return _XML_BAD_CHARS.sub("", text)


def _q(prefix: str, name: str) -> str:
    return f"{{{NS[prefix]}}}{name}"


class Walker:
    def __init__(self, pyatspi) -> None:
        self.at = pyatspi
        self._calc_columns: int | None = None

    def calc_columns(self) -> int:
        """Cells per row of a Calc table: 1024 before LibreOffice 7.4, 16384 since (OSWorld's rule)."""
        if self._calc_columns is None:
            try:
                out = subprocess.run(
                    ["libreoffice", "--version"],
                    stdin=subprocess.DEVNULL,  # not the server's request pipe
                    capture_output=True,
                    text=True,
                    timeout=30,
                ).stdout.split()
                version = tuple(int(x) for x in out[1].split(".")[:2])
            except (OSError, IndexError, ValueError, subprocess.SubprocessError):
                version = (7, 4)
            self._calc_columns = 1024 if version < (7, 4) else 16384
        return self._calc_columns

    def node(self, acc, depth: int = 0, flag: str | None = None) -> ET.Element:
        at = self.at
        attrib: dict[str, str] = {"name": _clean(acc.name or "")}
        states = acc.getState().get_states()
        for st in states:
            name = at.StateType._enum_lookup[st].split("_", 1)[1].lower()
            if name:
                attrib[_q("st", name)] = "true"
        for key, value in (acc.get_attributes() or {}).items():
            if key and _XML_NAME.fullmatch(
                key
            ):  # OSWorld's lxml would refuse the whole subtree; skip the key
                attrib[_q("attr", key)] = _clean(str(value))
        if attrib.get(_q("st", "visible")) == "true" and attrib.get(_q("st", "showing")) == "true":
            try:
                x, y, w, h = acc.queryComponent().getExtents(at.XY_SCREEN)[:4]
            except NotImplementedError:
                pass
            else:
                attrib[_q("cp", "screencoord")] = str((x, y))
                attrib[_q("cp", "size")] = str((w, h))
        text = ""
        try:
            t = acc.queryText()
            text = t.getText(0, t.characterCount).replace("\ufffc", "").replace("\ufffd", "")
        except NotImplementedError:
            pass
        for flag_name, query in (("image", "queryImage"), ("selection", "querySelection")):
            try:
                getattr(acc, query)()
                attrib[flag_name] = "true"
            except NotImplementedError:
                pass
        try:
            value = acc.queryValue()
        except NotImplementedError:
            pass
        else:
            for key, field in (
                ("value", "currentValue"),
                ("min", "minimumValue"),
                ("max", "maximumValue"),
                ("step", "minimumIncrement"),
            ):
                try:
                    attrib[_q("val", key)] = str(getattr(value, field))
                except Exception:  # an application may not implement one of them
                    pass
        try:
            action = acc.queryAction()
        except NotImplementedError:
            pass
        else:
            for i in range(action.nActions):
                name = action.getName(i).replace(" ", "-")
                if _XML_NAME.fullmatch(name):
                    attrib[_q("act", f"{name}_desc")] = _clean(action.getDescription(i) or "")
                    attrib[_q("act", f"{name}_kb")] = _clean(action.getKeyBinding(i) or "")
        raw_role = acc.getRoleName().strip()
        tag = (raw_role or "unknown").replace(" ", "-")
        if not _XML_NAME.fullmatch(tag):
            tag = "unknown"
        if not flag and raw_role == "document spreadsheet":
            flag = "calc"
        elem = ET.Element(tag, attrib)
        if text:
            elem.text = _clean(text)
        if depth >= MAX_DEPTH:
            return elem
        if flag == "calc" and tag == "table":
            self._calc_cells(acc, elem, depth, flag)
            return elem
        try:
            for i, child in enumerate(acc):
                if i == MAX_WIDTH:
                    break
                if child is not None:
                    elem.append(self.node(child, depth + 1, flag))
        except Exception as exc:  # an application that goes away mid-walk: keep what was read
            print(f"atspi: children of a {tag} not read: {exc}", file=sys.stderr, flush=True)
        return elem

    def _calc_cells(self, table, elem: ET.Element, depth: int, flag: str) -> None:
        """The cells of a Calc sheet that are on screen: rows of `calc_columns()` cells, the first showing
        cell found within the first `CALC_SCAN` columns, rows read until one has none showing."""
        columns = self.calc_columns()
        showing = self.at.STATE_SHOWING
        first_column: int | None = None
        row_start = 0
        rows_without = 0
        while True:
            found = False
            for column in range(first_column or 0, columns):
                cell = table[row_start + column]
                if cell is not None and cell.getState().contains(showing):
                    if first_column is None:
                        first_column = column
                    found = True
                    elem.append(self.node(cell, depth + 1, flag))
                elif first_column is not None or column >= CALC_SCAN:
                    break
            if first_column is not None and not found:
                return
            if first_column is None:
                rows_without += 1
                if rows_without > CALC_SCAN:  # OSWorld's: rows 0 to 500
                    return
            row_start += columns

    def desktop(self) -> list:
        """The registry's applications (RegistryUnavailable when it does not answer)."""
        try:
            return list(self.at.Registry.getDesktop(0))
        except Exception as exc:
            raise RegistryUnavailable(f"AT-SPI's registry did not answer: {exc}") from exc

    def tree(self) -> ET.Element:
        root = ET.Element("desktop-frame")  # OSWorld's root carries no attributes
        for app in self.desktop():
            if app is None:
                continue
            try:
                root.append(self.node(app, 1))
            except Exception as exc:  # an application that quit while being read
                print(f"atspi: application not read: {exc}", file=sys.stderr, flush=True)
        return root

    def terminal(self) -> str | None:
        """The text of GNOME Terminal's focused terminal in its active window, as OSWorld's `/terminal`
        reads it; None when there is none (or more than one)."""
        at = self.at
        found: list[ET.Element] = []
        for app in self.desktop():
            if app is None or app.getRoleName() != "application" or app.name != TERMINAL_APP:
                continue
            for frame in app:
                if frame is None or frame.getRoleName() != "frame":
                    continue
                if not frame.getState().contains(at.STATE_ACTIVE):
                    continue
                tree = self.node(frame, 2)
                found += [t for t in tree.iter("terminal") if t.get(_q("st", "focused")) == "true"]
        if len(found) != 1:
            return None
        return (found[0].text or "").rstrip()


def to_xml(root: ET.Element) -> str:
    """The tree as OSWorld's server sends it: no declaration, every namespace declared on the root."""
    out = ET.tostring(root, encoding="unicode")
    # ElementTree declares only the namespaces in use; OSWorld's lxml declares them all
    head, sep, rest = out.partition(">")
    missing = "".join(f' xmlns:{p}="{u}"' for p, u in NS.items() if f'xmlns:{p}="' not in head)
    if head.endswith("/"):  # an empty desktop: `<desktop-frame />`
        return head[:-1].rstrip() + missing + " />" + rest
    return head + missing + sep + rest


def main() -> int:
    try:
        import pyatspi
    except ImportError as exc:
        print(json.dumps({"ready": False, "error": f"pyatspi does not import: {exc}"}), flush=True)
        return 0
    walker = Walker(pyatspi)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        try:
            op = json.loads(line).get("op")
            if op == "tree":
                answer = {"ok": True, "xml": to_xml(walker.tree())}
            elif op == "terminal":
                answer = {"ok": True, "output": walker.terminal()}
            else:
                answer = {"ok": False, "error": f"unknown op {op!r}"}
        except RegistryUnavailable as exc:  # the server answers 503: the desktop's fault
            answer = {"ok": False, "busy": True, "error": str(exc)}
        except Exception as exc:  # reported to the server, which answers 500 with it
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
