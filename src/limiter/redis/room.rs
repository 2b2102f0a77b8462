//! Waiting rooms on Redis: the rules of `room/line.rs` in one script, on Redis's clock, so
//! that every instance sharing Redis shares one line and one count of admitted clients
//! exactly. Keys under the hash tag `{room:NAME}`: the admitted clients (a sorted set by last
//! request), the line (by ticket), the waiting clients by last request, and the room's state
//! (the next ticket, the admission bucket, admissions so far); all kept as long as a session
//! and a linger past the last request.

use super::RedisStore;
use crate::limiter::LimiterError;
use crate::limiter::store::{RoomBounds, RoomEntered};

/// KEYS: active, line, seen, state. ARGV: client, active, admit rate, session ms, linger ms,
/// most in line. Returns admitted (0/1), position, active, waiting, admitted so far.
const ENTER: &str = "local t = redis.call('TIME') \
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
  local client = ARGV[1] \
  local max, rate = tonumber(ARGV[2]), tonumber(ARGV[3]) \
  local session, linger, most = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]) \
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - session) \
  for _, c in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - linger, 'LIMIT', 0, 1000)) do \
    redis.call('ZREM', KEYS[2], c) redis.call('ZREM', KEYS[3], c) \
  end \
  local function touch() for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], session + linger) end end \
  local function answer(admitted, position) \
    return {admitted, position, redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2]), \
      tonumber(redis.call('HGET', KEYS[4], 'admitted') or '0')} \
  end \
  if redis.call('ZSCORE', KEYS[1], client) then \
    redis.call('ZADD', KEYS[1], now, client) touch() return answer(1, 0) \
  end \
  local burst = math.max(rate, 1) \
  local tokens = tonumber(redis.call('HGET', KEYS[4], 'tokens') or '') \
  local at = tonumber(redis.call('HGET', KEYS[4], 'at') or '') \
  if tokens == nil or at == nil then tokens = burst \
  else tokens = math.min(burst, tokens + math.max(0, now - at) * rate / 1000) end \
  if not redis.call('ZSCORE', KEYS[2], client) then \
    local waiting = redis.call('ZCARD', KEYS[2]) \
    if waiting >= most then return answer(0, waiting + 1) end \
    redis.call('ZADD', KEYS[2], redis.call('HINCRBY', KEYS[4], 'seq', 1), client) \
  end \
  redis.call('ZADD', KEYS[3], now, client) \
  local active, mine = redis.call('ZCARD', KEYS[1]), false \
  while active < max and tokens >= 1 do \
    local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1] \
    if not head then break end \
    redis.call('ZREM', KEYS[2], head) redis.call('ZREM', KEYS[3], head) \
    redis.call('ZADD', KEYS[1], now, head) \
    redis.call('HINCRBY', KEYS[4], 'admitted', 1) \
    tokens, active = tokens - 1, active + 1 \
    if head == client then mine = true end \
  end \
  redis.call('HSET', KEYS[4], 'tokens', tostring(tokens), 'at', tostring(now)) \
  touch() \
  if mine then return answer(1, 0) end \
  return answer(0, redis.call('ZRANK', KEYS[2], client) + 1)";

impl RedisStore {
    pub(super) async fn enter_room(
        &self,
        room: &str,
        client: &str,
        bounds: RoomBounds,
    ) -> Result<RoomEntered, LimiterError> {
        let key = |part: &str| format!("{}{{room:{room}}}:{part}", self.prefix);
        let reply: Vec<u64> = self
            .query(
                redis::cmd("EVAL")
                    .arg(ENTER)
                    .arg(4)
                    .arg(key("active"))
                    .arg(key("line"))
                    .arg(key("seen"))
                    .arg(key("state"))
                    .arg(client)
                    .arg(bounds.active)
                    .arg(bounds.admit_rate)
                    .arg(bounds.session_ms)
                    .arg(bounds.linger_ms)
                    .arg(bounds.max_line),
            )
            .await?;
        match reply[..] {
            [admitted, position, active, waiting, admitted_total] => Ok(RoomEntered {
                admitted: admitted == 1,
                position,
                active,
                waiting,
                admitted_total,
            }),
            _ => Err(LimiterError::unavailable(
                "a waiting room's script answered oddly",
            )),
        }
    }
}
