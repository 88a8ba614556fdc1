"""A sequence's generated text on its way out: stop strings, and holding back what could start one.

Text arrives from the detokenizer piece by piece. A stop string can only end in the newest piece (an older
match would have stopped the sequence already), so each piece is searched together with the last
``longest stop - 1`` characters before it, never the whole text. Unless the stop string is to be included,
those characters are also held back from the client until they can no longer begin a stop string. So the
work per piece and the text kept are bounded by the piece and the stop strings, whatever the output length.
"""

from __future__ import annotations


class OutputText:
    def __init__(self, stop: list[str], include_stop: bool) -> None:
        self.stop = stop
        self.include_stop = include_stop
        self._lookback = max(map(len, stop), default=1) - 1  # characters before a piece a match may start in
        self._hold = 0 if include_stop or not stop else self._lookback
        self._window = ""  # the last _lookback characters of the text
        self._unsent = ""  # text not handed out yet; while held back, it ends with _window
        self.stopped = False

    def add(self, piece: str) -> str | None:
        """Appends detokenized text. Returns the stop string it completes, if any: the text then ends right
        before it (or right after it, with ``include_stop``) and takes no more pieces."""
        assert not self.stopped, "text added after a stop string"
        if not piece or not self.stop:
            self._unsent += piece
            return None
        search = self._window + piece
        hits = [(i, s) for s in self.stop if (i := search.find(s)) != -1]
        if not hits:
            self._unsent += piece
            self._window = search[-self._lookback :] if self._lookback else ""
            return None
        at, stop = min(hits)
        end = at + len(stop) if self.include_stop else at
        cut = len(search) - end  # characters to drop from the end of the text
        text = self._unsent + piece
        assert cut <= len(text), "a stop string reaching into text already handed out"
        self._unsent = text[: len(text) - cut]
        self.stopped = True
        return stop

    def take(self, finished: bool) -> str:
        """The text to hand out now: all that is new once the sequence has finished, else all but what could
        still turn out to be the start of a stop string."""
        n = len(self._unsent) if finished else max(0, len(self._unsent) - self._hold)
        out, self._unsent = self._unsent[:n], self._unsent[n:]
        return out
