// HTTP helpers of the interoperability tests for `snowluma-mcp serve-http`
// (the clients' --http mode and the conformance runner):
//   * readBearerToken: the bearer token from a serve-http token file;
//   * httpTarget: the --http URL / --http-token-file options of a client;
//   * startBearerProxy: a test-only reverse proxy that adds the bearer
//     header, for the conformance suite, which cannot send one itself.
// Tokens are read from files only (never argv) and never printed.

import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';

/**
 * The token of a serve-http token file (`ID:TOKEN` per line, `#` comments,
 * blank lines ignored): of the entry `id`, or of the first entry.
 */
export function readBearerToken(file, id) {
    const text = fs.readFileSync(file, 'utf8');
    for (const raw of text.split('\n')) {
        const line = raw.trim();
        if (line === '' || line.startsWith('#')) continue;
        const colon = line.indexOf(':');
        if (colon <= 0) throw new Error(`${file}: a line is not ID:TOKEN`);
        if (id && line.slice(0, colon) !== id) continue;
        return line.slice(colon + 1);
    }
    throw new Error(id ? `${file}: no entry with ID ${id}` : `${file}: no ID:TOKEN entry`);
}

/**
 * The HTTP target of a client script: `--http URL` on the command line and
 * the token file from `--http-token-file FILE` or $SNOWLUMA_TEST_HTTP_TOKEN_FILE
 * (the entry $SNOWLUMA_TEST_HTTP_TOKEN_ID, or the first one).
 * Returns undefined when the script runs over stdio (no --http), else
 * {url: URL, token, headers: {Authorization}}. Throws a readable Error when
 * the options are incomplete.
 */
export function httpTarget(argv = process.argv.slice(2), env = process.env) {
    let url;
    let tokenFile = env.SNOWLUMA_TEST_HTTP_TOKEN_FILE || undefined;
    for (let i = 0; i < argv.length; i++) {
        if (argv[i] === '--http') url = argv[++i];
        else if (argv[i].startsWith('--http=')) url = argv[i].slice('--http='.length);
        else if (argv[i] === '--http-token-file') tokenFile = argv[++i];
        else if (argv[i].startsWith('--http-token-file=')) tokenFile = argv[i].slice('--http-token-file='.length);
    }
    if (url === undefined) return undefined;
    if (!url) throw new Error('--http needs the server URL (http://HOST:PORT/mcp)');
    if (!tokenFile) throw new Error('--http needs a token file: --http-token-file FILE or SNOWLUMA_TEST_HTTP_TOKEN_FILE');
    const token = readBearerToken(tokenFile, env.SNOWLUMA_TEST_HTTP_TOKEN_ID || undefined);
    return { url: new URL(url), token, headers: { Authorization: `Bearer ${token}` } };
}

const LOOPBACK = new Set(['127.0.0.1', 'localhost', '[::1]', '::1']);
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade']);

/**
 * A reverse proxy on the loopback interface (an ephemeral port) in front of
 * `upstream` (a URL; its path is kept): every request is forwarded with
 * `Authorization: Bearer <token>` set. A Host header or Origin that names
 * the proxy itself (a loopback name with the proxy's port) is mapped to the
 * upstream's port and scheme, so a same-origin request stays same-origin
 * for the server; any other Host/Origin (the DNS-rebinding scenario's
 * evil.example.com) is forwarded unchanged. Response bodies, SSE included,
 * are streamed through as they arrive; when either side goes away the
 * other is torn down. Resolves {url, close()} where url is the upstream URL
 * with the proxy's authority.
 */
export function startBearerProxy(upstream, token) {
    const upstreamTls = upstream.protocol === 'https:';
    const upstreamPort = upstream.port || (upstreamTls ? '443' : '80');
    const client = upstreamTls ? https : http;
    const bindHost = upstream.hostname === '[::1]' || upstream.hostname === '::1' ? '::1' : '127.0.0.1';
    const upstreamHost = upstream.hostname.replace(/^\[|\]$/g, '');
    // TLS: the server's name comes from the URL, never from the forwarded
    // Host header (Node would derive SNI and the certificate check from it,
    // and the DNS-rebinding scenario's Host is evil.example.com). An IP
    // address gets no SNI and is checked against the certificate's IP SANs.
    const servername = net.isIP(upstreamHost) ? '' : upstreamHost;
    let proxyPort;

    const mapHost = (value) => {
        if (typeof value !== 'string') return value;
        const m = /^(.*):(\d+)$/.exec(value.trim());
        if (m && LOOPBACK.has(m[1].toLowerCase()) && m[2] === String(proxyPort)) return `${m[1]}:${upstreamPort}`;
        return value;
    };
    const mapOrigin = (value) => {
        if (typeof value !== 'string') return value;
        let u;
        try { u = new URL(value); } catch { return value; }
        if (u.protocol === 'http:' && LOOPBACK.has(u.hostname.toLowerCase()) && u.port === String(proxyPort)) {
            return `${upstream.protocol}//${u.hostname}:${upstreamPort}`;
        }
        return value;
    };

    const server = http.createServer((req, res) => {
        const headers = {};
        for (const [k, v] of Object.entries(req.headers)) {
            if (!HOP_BY_HOP.has(k)) headers[k] = v;
        }
        headers.host = mapHost(req.headers.host);
        if (headers.origin !== undefined) headers.origin = mapOrigin(headers.origin);
        headers.authorization = `Bearer ${token}`;
        const up = client.request({
            protocol: upstream.protocol,
            hostname: upstreamHost,
            ...(upstreamTls ? { servername } : {}),
            port: upstreamPort,
            method: req.method,
            path: req.url,
            headers,
            // The upstream may use a test certificate: trust comes from NODE_EXTRA_CA_CERTS.
        }, (upRes) => {
            const out = {};
            for (const [k, v] of Object.entries(upRes.headers)) if (!HOP_BY_HOP.has(k)) out[k] = v;
            res.writeHead(upRes.statusCode ?? 502, out);
            res.flushHeaders();
            upRes.on('data', (chunk) => res.write(chunk));
            upRes.on('end', () => res.end());
            upRes.on('error', () => res.destroy());
            res.on('close', () => upRes.destroy());
        });
        up.on('error', (err) => {
            if (!res.headersSent) {
                res.writeHead(502, { 'content-type': 'text/plain' });
                res.end(`bearer proxy: upstream error: ${err.message}\n`);
            } else {
                res.destroy();
            }
        });
        req.on('aborted', () => up.destroy());
        res.on('close', () => { if (!res.writableFinished) up.destroy(); });
        req.pipe(up);
    });
    server.keepAliveTimeout = 1000;
    return new Promise((resolve, reject) => {
        server.once('error', reject);
        server.listen(0, bindHost, () => {
            proxyPort = server.address().port;
            const url = new URL(upstream.href);
            url.protocol = 'http:';
            url.port = String(proxyPort);
            resolve({
                url,
                close: () => new Promise((r) => {
                    server.closeAllConnections?.();
                    server.close(() => r());
                }),
            });
        });
    });
}
