//! What the HTTP layer does around every handler, one file each: the key check, the body limit, the body
//! read timeout, idempotency keys, the request timeout, and request metrics (and `test_leak`, a planted leak for the soak, off unless asked for). What each route needs comes from the route table (../routes.rs).

pub mod auth;
pub mod body_limit;
pub mod body_timeout;
pub mod idempotency;
pub mod observe;
pub mod test_leak;
pub mod timeout;
