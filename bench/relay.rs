//! The benchmark's floor: a proxy that does nothing but copy bytes. Each
//! connection it accepts gets its own connection to the upstream, and the
//! bytes are copied both ways as they come (no parsing, no pooling, no
//! log), on a current-thread runtime.
//!
//! Run on the proxy's core, it measures what one user-space hop costs on
//! this machine: the wake-ups, the system calls and the loopback copies
//! every proxy pays before it does any work of its own. What tessera or
//! nginx add beyond the relay is their own work; what the relay adds over
//! direct, no proxy can avoid here.
//!
//! Usage: `bench-relay LISTEN UPSTREAM` (e.g. `127.0.0.1:18082
//! 127.0.0.1:18081`); prints `listening ADDR` once bound.

use tokio::net::{TcpListener, TcpStream};

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        eprintln!("usage: bench-relay LISTEN UPSTREAM");
        std::process::exit(2);
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let listener = TcpListener::bind(&listen).await.expect("bind");
        println!(
            "listening {}",
            listener.local_addr().expect("local address")
        );
        loop {
            let Ok((mut caller, _)) = listener.accept().await else {
                continue;
            };
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let Ok(mut up) = TcpStream::connect(&upstream).await else {
                    return;
                };
                let _ = caller.set_nodelay(true);
                let _ = up.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut caller, &mut up).await;
            });
        }
    });
}
