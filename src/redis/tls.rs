//! TLS on the Redis connections, through nginx's own OpenSSL layer (`ngx_ssl_*`), the way
//! `ngx_http_proxy_module` does it for upstreams.
//!
//! Configuration time ([`configure`]): one `SSL_CTX` per `ratelimit_redis`, freed with the
//! configuration pool. Connection time ([`start`], then [`finish`] from the handshake handler):
//! after the TCP connect, a handshake bounded by the connect deadline; nothing is written to
//! Redis before it ends, and the server's certificate is checked before anything is. nginx then
//! swaps `c->send`/`c->recv` for the SSL versions, so the connection's reads and writes need no
//! change. [`shutdown`] frees the `SSL` without waiting for the peer.
//!
//! Sessions are reused per worker and server address: a reconnect after a Redis restart or an
//! idle close costs an abbreviated handshake instead of a full one.
//!
//! An nginx built without SSL has none of this; `ssl=on` then fails `nginx -t`.

use ngx::ffi::{ngx_conf_t, ngx_connection_t, ngx_destroy_pool, ngx_pool_t};
use ngx::ngx_conf_log_error;

use super::tls_params::TlsParams;

/// A configuration error, already logged.
#[derive(Debug)]
pub struct Logged;

#[cfg(ngx_ssl)]
pub use imp::{finish, start, TlsConf};
#[cfg(not(ngx_ssl))]
pub use none::{finish, start, TlsConf};

/// Builds the TLS context of `ratelimit_redis` from its parameters; `Ok(None)` without `ssl=on`.
/// Errors are logged here (nginx appends the file and line).
///
/// # Safety
/// `cf` is the configuration being parsed.
pub unsafe fn configure(
    cf: *mut ngx_conf_t,
    params: &TlsParams,
    addr: &str,
    is_unix: bool,
) -> Result<Option<TlsConf>, Logged> {
    let settings = match params.resolve(addr, is_unix) {
        Ok(Some(s)) => s,
        Ok(None) => return Ok(None),
        Err(msg) => {
            ngx_conf_log_error!(ngx::ffi::NGX_LOG_EMERG, cf, "{msg}");
            return Err(Logged);
        }
    };
    #[cfg(ngx_ssl)]
    return imp::configure(cf, &settings);
    #[cfg(not(ngx_ssl))]
    {
        let _ = settings;
        ngx_conf_log_error!(
            ngx::ffi::NGX_LOG_EMERG,
            cf,
            "\"ssl=on\" of the \"ratelimit_redis\" directive needs an nginx built with SSL \
             (--with-http_ssl_module)"
        );
        Err(Logged)
    }
}

/// Before closing a connection: frees its `SSL`, if any, without a close_notify exchange
/// (Redis needs none, and waiting for one could leave the `SSL` behind), and returns the pool
/// it came from, for [`destroy_pool`] once the connection is closed.
///
/// # Safety
/// `c` is an open connection of this module, about to be closed.
pub unsafe fn shutdown(c: *mut ngx_connection_t) -> *mut ngx_pool_t {
    #[cfg(ngx_ssl)]
    imp::shutdown(c);
    // Read before the connection goes back to nginx's free list.
    (*c).pool
}

/// Destroys what [`shutdown`] returned, after `ngx_close_connection`.
///
/// # Safety
/// `pool` is null or a connection pool created by [`start`], not used any more.
pub unsafe fn destroy_pool(pool: *mut ngx_pool_t) {
    if !pool.is_null() {
        ngx_destroy_pool(pool);
    }
}

/// Without SSL in nginx: no TLS settings are ever built (`ssl=on` fails `nginx -t`).
#[cfg(not(ngx_ssl))]
mod none {
    use ngx::ffi::{ngx_connection_t, ngx_peer_connection_t};

    use super::super::pool::RedisError;

    pub enum TlsConf {}

    /// # Safety
    /// Never called: there is no `TlsConf`.
    pub unsafe fn start(
        _c: *mut ngx_connection_t,
        _pc: &ngx_peer_connection_t,
        tls: &TlsConf,
        _handler: unsafe extern "C" fn(*mut ngx_connection_t),
        _quiet: bool,
    ) -> Result<bool, RedisError> {
        match *tls {}
    }

    /// # Safety
    /// Never called: there is no `TlsConf`.
    pub unsafe fn finish(_c: *mut ngx_connection_t, tls: &TlsConf) -> Result<(), RedisError> {
        match *tls {}
    }
}

#[cfg(ngx_ssl)]
mod imp {
    use core::cell::RefCell;
    use core::ffi::{c_long, c_void, CStr};
    use core::ptr;
    use std::ffi::CString;

    use ngx::ffi::{
        ngx_conf_t, ngx_connection_log_error_e_NGX_ERROR_ERR,
        ngx_connection_log_error_e_NGX_ERROR_IGNORE_ECONNRESET, ngx_connection_t, ngx_create_pool,
        ngx_cycle, ngx_peer_connection_t, ngx_pnalloc, ngx_pool_cleanup_add, ngx_ssl_certificate,
        ngx_ssl_check_host, ngx_ssl_ciphers, ngx_ssl_cleanup_ctx, ngx_ssl_client_session_cache,
        ngx_ssl_create, ngx_ssl_create_connection, ngx_ssl_get_session, ngx_ssl_handshake,
        ngx_ssl_server_conf_index, ngx_ssl_set_session, ngx_ssl_shutdown, ngx_ssl_t,
        ngx_ssl_trusted_certificate, ngx_str_t, sockaddr, sockaddr_in, sockaddr_in6, NGX_SSL_TLSv1,
        NGX_SSL_TLSv1_1, NGX_SSL_TLSv1_2, NGX_SSL_TLSv1_3, SSL_CTX_ctrl, SSL_CTX_get_ex_data,
        SSL_SESSION_free, SSL_ctrl, SSL_get0_param, SSL_get_SSL_CTX, SSL_get_verify_result,
        SSL_session_reused, TLSEXT_NAMETYPE_host_name, X509_VERIFY_PARAM_set1_ip_asc,
        X509_verify_cert_error_string, AF_INET, AF_INET6, NGX_AGAIN, NGX_LOG_DEBUG, NGX_LOG_EMERG,
        NGX_OK, NGX_SSL_BUFFER, NGX_SSL_CLIENT, SSL_CTRL_MODE, SSL_CTRL_SET_TLSEXT_HOSTNAME,
        SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER, SSL_SESSION, X509_V_OK,
    };
    use ngx::{ngx_conf_log_error, ngx_log_error};

    use super::super::pool::RedisError;
    use super::super::tls_params::{self as params, Peer, TlsSettings};
    use super::Logged;

    // The protocol bits tls_params hands to ngx_ssl_create are nginx's.
    const _: () = assert!(
        params::TLS_V1 == NGX_SSL_TLSv1
            && params::TLS_V1_1 == NGX_SSL_TLSv1_1
            && params::TLS_V1_2 == NGX_SSL_TLSv1_2
            && params::TLS_V1_3 == NGX_SSL_TLSv1_3
    );

    /// `c->pool` for `ngx_ssl_create_connection`, which allocates its state (~150 bytes) there.
    const CONN_POOL_SIZE: usize = 512;

    /// What the configuration's `SSL_CTX` points to (its ex_data at nginx's server-conf index,
    /// unused on client contexts): the save-session callback only gets the connection.
    struct Shared {
        ssl: ngx_ssl_t,
        /// This worker's last session per server address (the forked copy is per worker).
        sessions: RefCell<Vec<(Vec<u8>, *mut SSL_SESSION)>>,
    }

    /// The TLS settings of the Redis connections, built at configuration time.
    pub struct TlsConf {
        /// Owned by the configuration pool, whose cleanup frees the `SSL_CTX` and the sessions.
        shared: *mut Shared,
        verify: bool,
        name: Peer,
        /// NUL-terminated copies for OpenSSL.
        name_c: CString,
        sni: Option<CString>,
        session_reuse: bool,
    }

    /// The pool cleanup of a `Shared`.
    unsafe extern "C" fn drop_shared(data: *mut c_void) {
        // SAFETY: `data` is the `Box<Shared>` leaked by `configure`, dropped only here.
        let shared = Box::from_raw(data as *mut Shared);
        if !shared.ssl.ctx.is_null() {
            ngx_ssl_cleanup_ctx(&shared.ssl as *const ngx_ssl_t as *mut c_void);
        }
        for &(_, s) in shared.sessions.borrow().iter() {
            // SAFETY: each saved session holds one reference, taken by ngx_ssl_get_session.
            SSL_SESSION_free(s);
        }
    }

    /// A NUL-terminated copy in the configuration pool: nginx's file functions may replace it
    /// with the full path, and OpenSSL reads it as a C string.
    unsafe fn pool_str(cf: *mut ngx_conf_t, s: &str) -> Option<ngx_str_t> {
        let p = ngx_pnalloc((*cf).pool, s.len() + 1) as *mut u8;
        if p.is_null() {
            return None;
        }
        // SAFETY: `p` has room for the bytes and the NUL.
        ptr::copy_nonoverlapping(s.as_ptr(), p, s.len());
        *p.add(s.len()) = 0;
        Some(ngx_str_t { len: s.len(), data: p })
    }

    pub unsafe fn configure(
        cf: *mut ngx_conf_t,
        s: &TlsSettings,
    ) -> Result<Option<super::TlsConf>, Logged> {
        const D: &str = "of the \"ratelimit_redis\" directive";
        let fail = |what: &str| {
            ngx_conf_log_error!(NGX_LOG_EMERG, cf, "{what} {D}");
            Err(Logged)
        };
        let cln = ngx_pool_cleanup_add((*cf).pool, 0);
        if cln.is_null() {
            return Err(Logged);
        }
        let shared = Box::into_raw(Box::new(Shared {
            // SAFETY: all-zero is ngx_ssl_t's state before ngx_ssl_create, as ngx_pcalloc gives.
            ssl: core::mem::zeroed(),
            sessions: RefCell::new(Vec::new()),
        }));
        (*cln).handler = Some(drop_shared);
        (*cln).data = shared as *mut c_void;
        let ssl = ptr::addr_of_mut!((*shared).ssl);
        (*ssl).log = (*cf).log;
        if ngx_ssl_create(ssl, s.protocols as _, shared as *mut c_void) != NGX_OK as isize {
            return fail("cannot create the TLS context");
        }
        // Our output buffer may move between a write that returned EAGAIN and its retry.
        SSL_CTX_ctrl(
            (*ssl).ctx,
            SSL_CTRL_MODE as _,
            SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER as _,
            ptr::null_mut(),
        );
        if let Some((cert, key)) = &s.certificate {
            let (Some(mut c), Some(mut k)) = (pool_str(cf, cert), pool_str(cf, key)) else {
                return Err(Logged);
            };
            if ngx_ssl_certificate(cf, ssl, &mut c, &mut k, ptr::null_mut()) != NGX_OK as isize {
                return fail(&format!(
                    "cannot load \"ssl_certificate={cert}\" or \"ssl_certificate_key={key}\""
                ));
            }
        }
        let Some(mut ciphers) = pool_str(cf, &s.ciphers) else { return Err(Logged) };
        if ngx_ssl_ciphers(cf, ssl, &mut ciphers, 0) != NGX_OK as isize {
            return fail(&format!("invalid \"ssl_ciphers={}\"", s.ciphers));
        }
        if let Some(ca) = &s.trusted_certificate {
            let Some(mut file) = pool_str(cf, ca) else { return Err(Logged) };
            let depth = s.verify_depth as _;
            if ngx_ssl_trusted_certificate(cf, ssl, &mut file, depth) != NGX_OK as isize {
                return fail(&format!("cannot load \"ssl_trusted_certificate={ca}\""));
            }
        }
        if ngx_ssl_client_session_cache(cf, ssl, s.session_reuse as _) != NGX_OK as isize {
            return Err(Logged);
        }
        let name_c = CString::new(s.name.as_str()).map_err(|_| Logged)?;
        let sni = match &s.sni {
            Some(n) => Some(CString::new(n.as_str()).map_err(|_| Logged)?),
            None => None,
        };
        Ok(Some(TlsConf {
            shared,
            verify: s.trusted_certificate.is_some(),
            name: s.name.clone(),
            name_c,
            sni,
            session_reuse: s.session_reuse,
        }))
    }

    /// This connection's key in the session cache: the server's address.
    /// The IP address of a peer, as text for OpenSSL.
    ///
    /// # Safety
    /// `sa` points to a socket address of its family's size.
    unsafe fn peer_ip(sa: *const sockaddr) -> Option<CString> {
        let ip: std::net::IpAddr = match (*sa).sa_family as u32 {
            AF_INET => {
                let sin = &*(sa as *const sockaddr_in);
                std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)).into()
            }
            AF_INET6 => {
                let sin6 = &*(sa as *const sockaddr_in6);
                std::net::Ipv6Addr::from(sin6.sin6_addr.__in6_u.__u6_addr8).into()
            }
            _ => return None,
        };
        CString::new(ip.to_string()).ok()
    }

    unsafe fn peer_key(c: *mut ngx_connection_t) -> Vec<u8> {
        // SAFETY: `start` set c->sockaddr/socklen from the peer connection's own.
        core::slice::from_raw_parts((*c).sockaddr as *const u8, (*c).socklen as usize).to_vec()
    }

    /// `c->ssl->save_session`: a new session (with TLS 1.3 it arrives after the handshake,
    /// with the first reply); it replaces the one kept for this server.
    unsafe extern "C" fn save_session(c: *mut ngx_connection_t) {
        // SAFETY: called by OpenSSL's new-session callback on one of our TLS connections,
        // whose SSL_CTX's ex_data is the live `Shared` of its configuration.
        let ctx = SSL_get_SSL_CTX((*(*c).ssl).connection);
        let shared = SSL_CTX_get_ex_data(ctx, ngx_ssl_server_conf_index) as *const Shared;
        if shared.is_null() {
            return;
        }
        let session = ngx_ssl_get_session(c);
        if session.is_null() {
            return;
        }
        let key = peer_key(c);
        let mut sessions = (*shared).sessions.borrow_mut();
        match sessions.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => {
                // SAFETY: the replaced session's reference was ours.
                SSL_SESSION_free(core::mem::replace(&mut slot.1, session));
            }
            None => sessions.push((key, session)),
        }
    }

    /// Starts the handshake on a connected socket: `Ok(true)` when it is done already,
    /// `Ok(false)` when nginx now owns the connection's event handlers and calls `handler`
    /// when it ends, fails or times out (the connect deadline, still armed on `c->write`).
    /// `quiet`: the outage was reported, nginx's own handshake error lines are left out.
    ///
    /// # Safety
    /// `c` is this module's connection to `pc`'s server, connected, with nothing written yet.
    pub unsafe fn start(
        c: *mut ngx_connection_t,
        pc: &ngx_peer_connection_t,
        tls: &TlsConf,
        handler: unsafe extern "C" fn(*mut ngx_connection_t),
        quiet: bool,
    ) -> Result<bool, RedisError> {
        let err = |what: &str| Err(RedisError::Tls(what.to_owned()));
        if (*c).pool.is_null() {
            // Destroyed by destroy_pool when the connection closes.
            (*c).pool = ngx_create_pool(CONN_POOL_SIZE, (*c).log);
            if (*c).pool.is_null() {
                return err("out of memory");
            }
        }
        (*c).sockaddr = pc.sockaddr;
        (*c).socklen = pc.socklen;
        let ssl = ptr::addr_of_mut!((*tls.shared).ssl);
        let flags = (NGX_SSL_BUFFER | NGX_SSL_CLIENT) as _;
        if ngx_ssl_create_connection(ssl, c, flags) != NGX_OK as isize {
            return err("cannot create the connection state");
        }
        let conn = (*(*c).ssl).connection;
        if let Some(sni) = &tls.sni {
            // SSL_set_tlsext_host_name, a macro; OpenSSL copies the name.
            let host = sni.as_ptr() as *mut c_void;
            let rc = SSL_ctrl(
                conn,
                SSL_CTRL_SET_TLSEXT_HOSTNAME as _,
                TLSEXT_NAMETYPE_host_name as _,
                host,
            );
            if rc != 1 {
                return err("cannot set the server name (SNI)");
            }
        }
        // ngx_ssl_check_host only knows DNS names: OpenSSL checks an IP SAN while verifying,
        // and a mismatch is a verification error like any other.
        let ip = match (tls.verify, &tls.name) {
            (true, Peer::Ip(_)) => Some(tls.name_c.clone()),
            (true, Peer::OwnIp) => peer_ip(pc.sockaddr),
            _ => None,
        };
        if let Some(ip) = ip {
            if X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(conn), ip.as_ptr()) != 1 {
                return err("cannot set the IP address to verify");
            }
        }
        if tls.session_reuse {
            (*(*c).ssl).save_session = Some(save_session);
            let key = peer_key(c);
            let saved =
                (*tls.shared).sessions.borrow().iter().find(|(k, _)| *k == key).map(|e| e.1);
            if let Some(session) = saved {
                // SSL_set_session takes its own reference. A failure only costs a full handshake.
                let _ = ngx_ssl_set_session(c, session);
            }
        }
        // nginx logs a failed handshake itself, at `info` for our connections' usual
        // ECONNRESET policy: `error` instead, once per outage (the pool's policy; a quiet
        // connection keeps its lowered level, see `finish`).
        (*c).set_log_error(ngx_connection_log_error_e_NGX_ERROR_ERR as _);
        if quiet {
            (*(*c).log).log_level = NGX_LOG_EMERG as _;
        }
        match ngx_ssl_handshake(c) {
            rc if rc == NGX_OK as isize => Ok(true),
            rc if rc == NGX_AGAIN as isize => {
                (*(*c).ssl).handler = Some(handler);
                Ok(false)
            }
            _ => err("handshake failed"),
        }
    }

    /// The handshake ended (or its deadline passed): whether the connection may carry commands,
    /// that is, it is done and the certificate is valid for the expected name or address.
    ///
    /// # Safety
    /// `c` is the connection `start` was called on.
    pub unsafe fn finish(c: *mut ngx_connection_t, tls: &TlsConf) -> Result<(), RedisError> {
        // What Conn::connect set, for the rest of the connection's life. A `quiet` connection
        // (opened while Redis was failing) stays quiet: with TLS 1.3 a server that refuses the
        // client certificate says so on the first read, which nginx would log at `crit` on
        // every probe; the pool reports the outage once with its reason either way.
        (*c).set_log_error(ngx_connection_log_error_e_NGX_ERROR_IGNORE_ECONNRESET as _);
        let err = |what: String| Err(RedisError::Tls(what));
        if (*(*c).write).timedout() != 0 || (*(*c).read).timedout() != 0 {
            return err("handshake timed out".into());
        }
        if (*(*c).ssl).handshaked() == 0 {
            return err("handshake failed".into());
        }
        let conn = (*(*c).ssl).connection;
        if tls.verify {
            // nginx's verify callback lets every handshake finish: the result is checked here.
            let rc = SSL_get_verify_result(conn);
            if rc != X509_V_OK as c_long {
                // SAFETY: OpenSSL returns a static string for any code.
                let reason = CStr::from_ptr(X509_verify_cert_error_string(rc)).to_string_lossy();
                return err(format!("certificate verify failed: {reason}"));
            }
            if let Peer::Host(host) = &tls.name {
                let mut name = ngx_str_t { len: host.len(), data: tls.name_c.as_ptr() as *mut u8 };
                if ngx_ssl_check_host(c, &mut name) != NGX_OK as isize {
                    return err(format!("certificate does not match \"{host}\" (ssl_name)"));
                }
            }
        }
        let reused = SSL_session_reused(conn) == 1;
        ngx_log_error!(
            NGX_LOG_DEBUG,
            (*ngx_cycle).log,
            "ratelimit: redis tls handshake done, session {}",
            if reused { "reused" } else { "new" }
        );
        Ok(())
    }

    /// Frees the connection's `SSL`, if any, without sending or awaiting close_notify.
    pub unsafe fn shutdown(c: *mut ngx_connection_t) {
        let sc = (*c).ssl;
        if sc.is_null() {
            return;
        }
        (*sc).set_no_wait_shutdown(1);
        (*sc).set_no_send_shutdown(1);
        // With both flags set it returns NGX_OK at once and frees the SSL (c->ssl = NULL).
        let _ = ngx_ssl_shutdown(c);
    }
}
