"""Provider rate limits shared by every worker on every machine, held in Redis.

Each limited (provider, model, kind) is a Redis hash of sub-bucket counts: the window is cut
into 60 sub-buckets, numbered from Redis ``TIME`` so every worker reads the same clock. An
acquisition is admitted when the counts of the last ``window`` plus a margin, together with
what it asks for, stay within the limit. Unlike a token bucket, which lets up to twice the
limit through in one window, this is strict: no span of ``window`` seconds, sliding or
calendar-aligned, sees more than the limit, even when a request reaches the provider up to
:data:`ARRIVAL` seconds (or one sub-bucket, ``window / 60``, if longer) after it was
admitted. The check and the increments of all
the keys of one acquisition run in one Lua script, so an acquisition denied by its tokens
takes no request slot. The one exception to strictness: an acquisition larger than the limit
itself is admitted when its window is otherwise empty, so that it is not refused forever.
Redis failures admit, with a warning: a rate limit is protection, not correctness.

A token limit is also a queue, so that a large request is not starved by small ones (which
would otherwise refill the room it waits for before it comes back). An acquisition denied
with a ticket (the step's idempotency key, the same on every try) holds a place: a hold of
its tokens, first come first served. Every acquisition counts the holds ahead of it as taken
(a holder, those older than its own; anyone else, all of them), so the window drains until
the oldest holder fits, and it is admitted on its return; then its hold goes. A hold whose
holder does not come back (its run cancelled, or past its deadline and withdrawn) lapses a
quarter of its wait and one window after it was due. So a request within the limit waits
about a window behind each request queued ahead of it, never for ever. The queue is one more
key read in the same script: no round trip is added.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.errors import ConfigError

if TYPE_CHECKING:
    import redis

log = logging.getLogger(__name__)

VARIABLE = "HARNESS_RATE_LIMITS"
SUB_BUCKETS = 60
#: The longest a request is allowed to take from its admission to its arrival at the
#: provider, seconds: the SDK client is made before the admission, so this is one request's
#: trip through the HTTP client and the network, with room for a busy machine's scheduling.
ARRIVAL = 0.5
_PREFIX = "harness:rate:"
_LIMIT = re.compile(r"(\d+)\s*(rpm|tpm)", re.IGNORECASE)

# KEYS: the hashes to check, then the token hash's queue of holds if ARGV[6] is '1'. ARGV:
# sub-bucket width (us), span, ttl (ms), ticket ('' for none), grace (us), '1' or '0', the
# time (us; '' for Redis's TIME), then per hash its limit and the units asked. Returns
# {1, bucket} when admitted, {0, wait in us} when not. A hold is "units:created:due:until"
# (us), under its ticket; the token hash is the last hash when there is a queue.
_ACQUIRE = """
local t = tonumber(ARGV[7])
if t == nil then
  local now = redis.call('TIME')
  t = tonumber(now[1]) * 1000000 + tonumber(now[2])
end
local width = tonumber(ARGV[1])
local span = tonumber(ARGV[2])
local ticket = ARGV[4]
local grace = tonumber(ARGV[5])
local queued = ARGV[6] == '1'
local counted = #KEYS
local hkey = nil
if queued then hkey = KEYS[#KEYS]; counted = counted - 1 end
local b = math.floor(t / width)
-- The holds ahead of this acquisition: every live one, or, for a holder, those older than its own.
local ahead, mine, latest = 0, nil, 0
if queued then
  local flat = redis.call('HGETALL', hkey)
  local live = {}
  for k = 1, #flat, 2 do
    local n, created, due, til = string.match(flat[k + 1], '(%d+):(%d+):(%d+):(%d+)')
    if tonumber(til) <= t then
      redis.call('HDEL', hkey, flat[k])
    else
      live[#live + 1] = {flat[k], tonumber(n), tonumber(created), tonumber(due)}
      if flat[k] == ticket then mine = tonumber(created) end
    end
  end
  for _, h in ipairs(live) do
    if h[1] ~= ticket and (mine == nil or h[3] < mine or (h[3] == mine and h[1] < ticket)) then
      ahead = ahead + h[2]
      if h[4] > latest then latest = h[4] end
    end
  end
end
local wait = 0
for i = 1, counted do
  local key = KEYS[i]
  local limit = tonumber(ARGV[6 + 2 * i])
  local n = tonumber(ARGV[7 + 2 * i])
  local held = 0
  if queued and i == counted then held = ahead end
  local flat = redis.call('HGETALL', key)
  local live, counts, stale = {}, {}, {}
  local sum = 0
  for k = 1, #flat, 2 do
    local f = tonumber(flat[k])
    if f <= b - span then
      stale[#stale + 1] = flat[k]
    else
      local c = tonumber(flat[k + 1])
      sum = sum + c
      live[#live + 1] = f
      counts[f] = c
    end
  end
  if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
  if sum + held + n > limit and sum + held > 0 then
    table.sort(live)
    local rest = sum
    local last = b - span
    for _, f in ipairs(live) do
      if rest + held + n <= limit then break end
      rest = rest - counts[f]
      last = f
    end
    local w = (last + span) * width - t
    -- Behind holds that the window's room cannot serve yet: after the last of them is due.
    if held > 0 and latest - t > w then w = latest - t end
    if w <= 0 then w = width end
    if w > wait then wait = w end
  end
end
if wait > 0 then
  if queued and ticket ~= '' then
    -- Denied: hold a place in the queue (kept if held already), due back after the wait.
    local created = mine or t
    local n = tonumber(ARGV[7 + 2 * counted])
    local due = t + wait
    local til = due + math.floor(wait / 4) + grace
    redis.call('HSET', hkey, ticket, string.format('%d:%d:%d:%d', n, created, due, til))
    local ms = math.ceil((til - t) / 1000)
    if redis.call('PTTL', hkey) < ms then redis.call('PEXPIRE', hkey, ms) end
  end
  return {0, math.ceil(wait)}
end
if mine ~= nil then redis.call('HDEL', hkey, ticket) end
local field = string.format('%d', b)
for i = 1, counted do
  local n = tonumber(ARGV[7 + 2 * i])
  if n ~= 0 then
    redis.call('HINCRBY', KEYS[i], field, n)
    redis.call('PEXPIRE', KEYS[i], ARGV[3])
  end
end
return {1, b}
"""

# KEYS[1]: the token hash. ARGV: width (us), span, ttl (ms), delta, target bucket or '', the
# time (us; '' for Redis's TIME). A target bucket that has left the window is no longer
# counted: nothing to correct.
_SETTLE = """
local t = tonumber(ARGV[6])
if t == nil then
  local now = redis.call('TIME')
  t = tonumber(now[1]) * 1000000 + tonumber(now[2])
end
local b = math.floor(t / tonumber(ARGV[1]))
local target = b
if ARGV[5] ~= '' then
  target = tonumber(ARGV[5])
  if target <= b - tonumber(ARGV[2]) then return 0 end
end
redis.call('HINCRBY', KEYS[1], string.format('%d', target), ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""


@dataclass(frozen=True)
class Limits:
    """Requests and tokens allowed per window; ``None``: that kind is not limited."""

    requests: int | None = None
    tokens: int | None = None


@dataclass(frozen=True)
class Grant:
    """The answer to :meth:`RateLimiter.acquire`.

    ``wait`` is 0.0 when admitted; otherwise nothing was taken and the caller should try
    again after ``wait`` seconds. ``bucket`` is the sub-bucket the reservation was counted
    in (``None`` when nothing was counted); pass it to :meth:`RateLimiter.settle`.
    """

    wait: float
    reserved_tokens: int
    bucket: int | None = None


def parse_limits(text: str) -> dict[tuple[str, str], Limits]:
    """Parse ``HARNESS_RATE_LIMITS``: ``"openai:gpt-4.1-mini=500rpm/200000tpm; anthropic:*=50rpm"``.

    Keys are ``(provider, model)``; ``model`` is ``"*"`` for a provider-wide entry, which still
    counts each model separately.
    """
    table: dict[tuple[str, str], Limits] = {}
    for raw in text.split(";"):
        entry = raw.strip()
        if not entry:
            continue
        target, eq, spec = entry.partition("=")
        provider, colon, model = target.partition(":")
        provider, model = provider.strip(), model.strip()
        if not eq or not colon or not provider or not model:
            raise ConfigError(f"{VARIABLE}: {entry!r} is not PROVIDER:MODEL=LIMIT[/LIMIT]")
        if provider == "*":
            raise ConfigError(f"{VARIABLE}: {entry!r}: the provider cannot be '*'")
        if (provider, model) in table:
            raise ConfigError(f"{VARIABLE}: {provider}:{model} is given more than once")
        table[(provider, model)] = _parse_spec(entry, spec)
    return table


def _parse_spec(entry: str, spec: str) -> Limits:
    found: dict[str, int] = {}
    for raw in spec.split("/"):
        part = raw.strip()
        match = _LIMIT.fullmatch(part)
        if match is None:
            raise ConfigError(f"{VARIABLE}: {entry!r}: {part!r} is not <n>rpm or <n>tpm")
        kind = match[2].lower()
        if kind in found:
            raise ConfigError(f"{VARIABLE}: {entry!r}: {kind} is given more than once")
        value = int(match[1])
        if value <= 0:
            raise ConfigError(f"{VARIABLE}: {entry!r}: {part!r} must be positive")
        found[kind] = value
    return Limits(requests=found.get("rpm"), tokens=found.get("tpm"))


def limits_for(table: dict[tuple[str, str], Limits], provider: str, model: str) -> Limits:
    """The limits of one model: its own entry's, each kind it lacks from ``provider:*``."""
    exact = table.get((provider, model), Limits())
    wild = table.get((provider, "*"), Limits())
    return Limits(
        requests=exact.requests if exact.requests is not None else wild.requests,
        tokens=exact.tokens if exact.tokens is not None else wild.tokens,
    )


def _key(provider: str, model: str, kind: str) -> str:
    return f"{_PREFIX}{provider}:{model}:{kind}"


class RateLimiter:
    """Admits model calls under the limits of ``table``, counted in Redis across workers."""

    def __init__(
        self,
        client: redis.Redis,
        table: dict[tuple[str, str], Limits],
        window: float = 60.0,
        arrival: float = ARRIVAL,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``clock`` (seconds, as :func:`time.time`) replaces Redis's ``TIME``, for a test
        that moves time by hand; by default every worker reads the one clock of Redis."""
        if not (math.isfinite(window) and window > 0):
            raise ConfigError(f"HARNESS_RATE_WINDOW={window!r} must be a positive number")
        import redis  # loaded already: ``client`` is one of its objects

        self.client = client
        #: What a Redis outage raises (redis-py is imported where a client is
        #: made, not with this module: the settings parse the limits at import).
        self._unavailable = redis.RedisError
        self.table = table
        self.window = window
        self.clock = clock
        width = window / SUB_BUCKETS
        #: Sub-buckets counted: the window's own, one more so that any span of ``window``
        #: seconds (whatever its alignment to sub-buckets) is covered, and enough for a
        #: request admitted at the end of one to arrive :data:`ARRIVAL` seconds later.
        self.span = SUB_BUCKETS + 1 + max(1, math.ceil(arrival / width))
        self._width_us = repr(width * 1_000_000)
        self._ttl_ms = math.ceil(2 * self.span * width * 1000)  # outlives every counted bucket
        #: A hold outlives the wait it was told by a quarter of it and this (one counted
        #: span): room for the jitter of its return and a slow message.
        self._grace_us = math.ceil(self.span * width * 1_000_000)
        self._acquire = client.register_script(_ACQUIRE)
        self._settle = client.register_script(_SETTLE)

    @classmethod
    def from_settings(
        cls, redis_url: str | None, limits: str, window: float = 60.0, timeout: float = 1.0
    ) -> RateLimiter | None:
        """A limiter for ``HARNESS_RATE_LIMITS``, or ``None`` when that is blank.

        Its client retries twice, briefly: redis-py's default (ten retries, backing off up to
        a second) would hold every model call for seconds while Redis is down.
        """
        table = parse_limits(limits)
        if not table:
            return None
        if redis_url is None:
            raise ConfigError(
                f"{VARIABLE} needs HARNESS_REDIS_URL: the limits are shared through Redis"
            )
        import redis
        from redis.backoff import ExponentialWithJitterBackoff
        from redis.retry import Retry

        try:
            client = redis.Redis.from_url(
                redis_url,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                retry=Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.1), retries=2),
            )
        except ValueError as err:
            raise ConfigError(f"HARNESS_REDIS_URL={redis_url!r}: {err}") from None
        return cls(client, table, window)

    def close(self) -> None:
        self.client.close()

    def _now_us(self) -> str:
        """The time the scripts count with, in microseconds: '' for Redis's own."""
        return "" if self.clock is None else str(round(self.clock() * 1_000_000))

    def acquire(self, provider: str, model: str, tokens: int, ticket: str | None = None) -> Grant:
        """Take one request and ``tokens`` estimated tokens, or say how long to wait.

        ``ticket`` names the caller across its tries (a step's idempotency key): denied
        under a token limit, it holds a place in the queue, and returns to find the room
        it needs kept from those who came after it (see the module's docstring).
        """
        if tokens < 0:
            raise ValueError(f"tokens must not be negative, got {tokens}")
        limits = limits_for(self.table, provider, model)
        keys: list[str] = []
        queued = limits.tokens is not None
        args: list[str | int] = [
            self._width_us,
            self.span,
            self._ttl_ms,
            ticket or "",
            self._grace_us,
            "1" if queued else "0",
            self._now_us(),
        ]
        if limits.requests is not None:
            keys.append(_key(provider, model, "req"))
            args += [limits.requests, 1]
        if limits.tokens is not None:
            keys.append(_key(provider, model, "tok"))
            args += [limits.tokens, tokens]
        if not keys:
            return Grant(0.0, 0)
        if queued:
            keys.append(_key(provider, model, "queue"))
        try:
            admitted, value = self._acquire(keys=keys, args=args)
        except self._unavailable as err:
            log.warning("rate limit of %s:%s not checked, Redis failed: %s", provider, model, err)
            return Grant(0.0, 0)
        if not admitted:
            return Grant(int(value) / 1_000_000, 0)
        reserved = tokens if limits.tokens is not None else 0
        return Grant(0.0, reserved, int(value))

    def withdraw(self, provider: str, model: str, ticket: str) -> None:
        """Give up ``ticket``'s place in the queue (its run will not come back for it)."""
        if limits_for(self.table, provider, model).tokens is None:
            return
        try:
            self.client.hdel(_key(provider, model, "queue"), ticket)
        except self._unavailable as err:
            log.warning("rate limit hold of %s:%s not withdrawn: %s", provider, model, err)

    def settle(
        self, provider: str, model: str, reserved: int, used: int, bucket: int | None = None
    ) -> None:
        """Correct the token count once the call's real usage is known.

        Extra tokens are added to the current sub-bucket. Tokens reserved but not used are
        returned to the sub-bucket they were reserved in (``bucket``, from the grant) while it
        is still counted; without ``bucket`` they come off the current one, which can let
        through more than the limit once the reservation's own sub-bucket has left the window.
        """
        delta = used - reserved
        if delta == 0 or limits_for(self.table, provider, model).tokens is None:
            return
        target = "" if bucket is None or delta > 0 else str(bucket)
        args: list[str | int] = [
            self._width_us,
            self.span,
            self._ttl_ms,
            delta,
            target,
            self._now_us(),
        ]
        try:
            self._settle(keys=[_key(provider, model, "tok")], args=args)
        except self._unavailable as err:
            log.warning("token usage of %s:%s not settled, Redis failed: %s", provider, model, err)
