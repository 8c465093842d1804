"""The policy side: the typed action space (`actions`), prompt building (`prompt`, `unified`,
`gui_r1_desktop`), image sizing (`imaging`), rendering actions as pyautogui code (`render`) and parsing the
model's responses into actions (`parse`). Model output is parsed, never executed."""
