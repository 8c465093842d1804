#!/usr/bin/env bash
# Set up what guirl needs on a fresh Debian/Ubuntu machine: system packages (installed with apt-get when
# run as root, otherwise listed for you to install) and the project's virtual environment.
#   usage: scripts/bootstrap.sh PYTHON VENV [PACKAGE-LIST...]   (default list: system-packages.txt)
set -euo pipefail
PYTHON=${1:-python3}
VENV=${2:-.venv}
HERE=$(cd "$(dirname "$0")" && pwd)
shift $(( $# < 2 ? $# : 2 ))
LISTS=("$@")
((${#LISTS[@]})) || LISTS=("$HERE/system-packages.txt")

if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "guirl needs Python >= 3.11; '$PYTHON' was not found (set PYTHON=/path/to/python3.11)." >&2
    exit 1
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "guirl needs Python >= 3.11; $PYTHON is $("$PYTHON" -V 2>&1) (set PYTHON=/path/to/python3.11)." >&2
    exit 1
fi

# Debian packages: one "PACKAGE CHECK" per line in system-packages.txt; PACKAGE is needed when CHECK
# (a command name, "py:MODULE" for a module of $PYTHON, "path:FILE", or "deb" for the package itself) is
# missing.
missing=()
# PACKAGE may name alternatives, "a|b" (a package Debian and Ubuntu name differently): the first one apt
# knows is installed
pick() {
    local alt
    IFS='|' read -ra alts <<< "$1"
    if command -v apt-cache >/dev/null 2>&1; then
        for alt in "${alts[@]}"; do
            apt-cache show "$alt" >/dev/null 2>&1 && { echo "$alt"; return; }
        done
    fi
    echo "${alts[0]}"
}
while read -r pkg check; do
    [[ -z "$pkg" || "$pkg" == \#* ]] && continue
    if [[ "$check" == py:* ]]; then
        "$PYTHON" -c "import ${check#py:}" >/dev/null 2>&1 || missing+=("$pkg")
    elif [[ "$check" == path:* ]]; then
        [[ -e "${check#path:}" ]] || missing+=("$pkg")
    elif [[ "$check" == deb ]]; then
        [[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" == "install ok installed" ]] || missing+=("$pkg")
    else
        command -v "$check" >/dev/null 2>&1 || missing+=("$pkg")
    fi
done < <(cat "${LISTS[@]}")
# venv needs ensurepip, which Debian's python3 ships separately
if [[ ! -x "$VENV/bin/python" ]] && ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    missing+=("python3-venv")
fi

if ((${#missing[@]})); then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "guirl: installing system packages: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        for i in "${!missing[@]}"; do  # alternatives are known once apt's lists are
            [[ "${missing[$i]}" == *"|"* ]] && missing[$i]=$(pick "${missing[$i]}" </dev/null)
        done
        apt-get install -y -qq --no-install-recommends "${missing[@]}"
    else
        echo "guirl: these system packages are missing; install them and run make again:" >&2
        for i in "${!missing[@]}"; do
            [[ "${missing[$i]}" == *"|"* ]] && missing[$i]=$(pick "${missing[$i]}" </dev/null)
        done
        echo "    sudo apt-get install ${missing[*]}" >&2
        exit 1
    fi
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "guirl: creating $VENV with $("$PYTHON" -V 2>&1)"
    "$PYTHON" -m venv "$VENV"
fi
