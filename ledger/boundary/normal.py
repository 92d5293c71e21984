"""The one normal form the secret boundary's detectors judge (``ledger.boundary``).

A text is brought to its normal form by rounds, each of them

1. percent-decoding (``%73k`` is ``sk``), HTML character references (``&#115;``) and
   backslash escapes (``\\u0073``, ``\\x73``);
2. Unicode NFKC (fullwidth and mathematical letters, ligatures, superscripts become ASCII);
3. removing every character that renders as nothing: the Default_Ignorable_Code_Point
   property (zero-width characters, the combining grapheme joiner, Hangul fillers, variation
   selectors, tag characters), the format (Cf), control (Cc, but tab and newlines),
   nonspacing (Mn) and enclosing (Me) marks, as the ``regex`` package's Unicode tables say;
4. folding letters of other scripts to the Latin letters they are confusable with (Unicode
   TR39's confusables table, through ``disarm``: a Cyrillic ``к`` or a Greek omicron reads
   ``k``, ``o``),

until a round changes nothing. A text still changing after :data:`MAX_ROUNDS` rounds is
*unsettled*: the boundary refuses it (nothing real is encoded eight times).

Then the **layers**: every run of base64 (standard or URL-safe) or hex digits that decodes to
text is decoded and brought to its own normal form, and so are the runs inside that, down to
:data:`MAX_LAYERS` layers. Each layer is a *form* of the text the detectors judge too. A layer
is at most three quarters of the run it came from, so the work is linear in the text.

Texts longer than :data:`MAX_TEXT` characters are not judged but refused (no request body or
log line is that long). The stored value is always the one that was sent: the normal form is
only what the rules read.
"""

import base64
import binascii
import html
import re
import unicodedata
from urllib.parse import unquote

import regex
from disarm import normalize_confusables

MAX_TEXT = 2 * 1024 * 1024  # characters; longer: refused whole (the request body limit is 1 MB)
MAX_ROUNDS = 8  # decoding rounds to reach a fixpoint; still changing after: refused
MAX_LAYERS = 3  # base64/hex layers decoded inside one another
MIN_LAYER_TEXT = 6  # a decoded layer shorter than this holds no credential

_INVISIBLE = regex.compile(r"[\p{Default_Ignorable_Code_Point}\p{Cf}\p{Cc}\p{Mn}\p{Me}--[\t\n\r]]", flags=regex.V1)
_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|x([0-9a-fA-F]{2})|U([0-9a-fA-F]{8}))")
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")
_HEX_RUN = re.compile(r"(?<![0-9a-fA-F])(?:[0-9a-fA-F]{2}){8,}(?![0-9a-fA-F])")
_URLSAFE = str.maketrans("-_", "+/")


def _unescape(match: re.Match[str]) -> str:
    code = int(match.group(1) or match.group(2) or match.group(3), 16)
    if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
        return match.group(0)
    return chr(code)


def _decoded(text: str) -> str:
    if "%" in text:
        text = unquote(text)
    if "&" in text:
        text = html.unescape(text)
    if "\\" in text:
        text = _ESCAPE.sub(_unescape, text)
    return text


def _round(text: str) -> str:
    """One round: decode escapes, then NFKC, invisible characters out, confusables folded."""
    text = _decoded(text)
    if text.isascii():
        return text if text.isprintable() else _INVISIBLE.sub("", text)
    text = _INVISIBLE.sub("", unicodedata.normalize("NFKC", text))
    try:
        return normalize_confusables(text)
    except UnicodeError:  # a lone surrogate (never stored: ledger.storable refuses it)
        return normalize_confusables(text.encode("utf-8", "replace").decode("utf-8"))


def settle(text: str) -> tuple[str, bool]:
    """(the normal form of ``text`` without its layers, whether it settled in MAX_ROUNDS)."""
    for _ in range(MAX_ROUNDS + 1):  # MAX_ROUNDS that change it, and one that shows it settled
        following = _round(text)
        if following == text:
            return text, True
        text = following
    return text, False


def _as_text(data: bytes) -> str | None:
    """``data`` as UTF-8 text a reader would see (an invisible character may be in it),
    else None. A run cut short may end inside a character: up to three bytes are dropped."""
    for end in range(len(data), max(len(data) - 4, 0), -1):
        try:
            text = data[:end].decode("utf-8")
        except UnicodeDecodeError as error:
            if error.start < end - 3:  # not a character cut short at the end: not text
                return None
            continue
        visible = _INVISIBLE.sub("", text).replace("\t", "").replace("\n", "").replace("\r", "")
        return text if len(visible) >= MIN_LAYER_TEXT and visible.isprintable() else None
    return None


def _base64_text(run: str) -> str | None:
    run = run.rstrip("=").translate(_URLSAFE)
    for start in range(4):  # the run may begin with characters that are not part of the encoding
        chunk = run[start:]
        if len(chunk) % 4 == 1:
            chunk = chunk[:-1]
        try:
            data = base64.b64decode(chunk + "=" * (-len(chunk) % 4), validate=True)
        except binascii.Error:
            continue
        text = _as_text(data)
        if text is not None:
            return text
    return None


def layers(text: str) -> list[str]:
    """The texts that base64 and hex runs of ``text`` decode to (one level)."""
    found = []
    for run in _HEX_RUN.findall(text):
        decoded = _as_text(bytes.fromhex(run))
        if decoded is not None:
            found.append(decoded)
    for match in _BASE64_RUN.finditer(text):
        run = match.group()
        if run.islower() or run.isupper():  # base64 of text has both cases; a word or a name
            continue
        decoded = _base64_text(run)
        if decoded is not None:
            found.append(decoded)
    return found


def normal_forms(text: str) -> tuple[list[str], bool]:
    """(every form the detectors judge: the normal form of ``text`` and of each layer
    inside it, whether every one of them settled)."""
    first, settled = settle(text)
    forms, frontier = [first], [first]
    for _ in range(MAX_LAYERS):
        following = []
        for form in frontier:
            for layer in layers(form):
                normal, ok = settle(layer)
                settled = settled and ok
                following.append(normal)
        forms.extend(following)
        frontier = following
    return forms, settled


def normalised(text: str) -> str:
    """``text`` as a person would read it (its normal form, without its layers)."""
    return settle(text)[0]
