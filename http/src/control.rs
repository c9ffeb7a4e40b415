//! The launcher's names for the control channel, whose messages and codec
//! live in `snowluma_proto::front` (framed like every IPC message, its
//! descriptors passed by `snowluma_proto::fdpass`). `Channel` is the
//! launcher's end; the front uses `snowluma_proto::front::FrontEnd`.

pub use snowluma_proto::front::{FrontSetup, LauncherEnd as Channel, ToFront, ToLauncher, send_blocking};
