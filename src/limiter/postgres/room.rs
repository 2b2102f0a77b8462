//! Waiting rooms on PostgreSQL: `room.sql`'s function, one call a request, the room's state
//! row locked so that every instance's calls for one room take turns (`floodgate_room_state`,
//! `floodgate_room_members`: schema version 4).

use super::PostgresStore;
use crate::limiter::LimiterError;

impl PostgresStore {
    /// A waiting room's answer to `client` (`room.sql`).
    pub(super) async fn enter_room(
        &self,
        room: &str,
        client: &str,
        bounds: crate::limiter::RoomBounds,
    ) -> Result<crate::limiter::RoomEntered, LimiterError> {
        let room = format!("{}{room}", self.prefix);
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let reply: Vec<i64> = self
            .db
            .query(
                &self.db.sql.room_enter,
                &[
                    &room,
                    &client,
                    &n(bounds.active),
                    &bounds.admit_rate,
                    &n(bounds.session_ms),
                    &n(bounds.linger_ms),
                    &n(bounds.max_line),
                ],
            )
            .await?;
        let u = |v: i64| u64::try_from(v).unwrap_or(0);
        match reply[..] {
            [admitted, position, active, waiting, admitted_total] => {
                Ok(crate::limiter::RoomEntered {
                    admitted: admitted == 1,
                    position: u(position),
                    active: u(active),
                    waiting: u(waiting),
                    admitted_total: u(admitted_total),
                })
            }
            _ => Err(LimiterError::unavailable(
                "a waiting room's function answered oddly",
            )),
        }
    }
}
