/**
 * HTTP/1.1 with keep-alive through `node:http` and `node:https`: no runtime
 * dependency, client certificates for mutual TLS (which the global `fetch`
 * cannot present without undici's own API), and an `AbortSignal` that
 * closes the connection, which is how the server learns a waiting caller
 * left and gives its queue place back.
 */

import http from "node:http";
import https from "node:https";
import { readFileSync } from "node:fs";

export interface TlsFiles {
  /** PEM file of the CA that signed the servers' certificates. */
  ca?: string | undefined;
  /** PEM files of a client certificate and its key, for mutual TLS. */
  cert?: string | undefined;
  key?: string | undefined;
}

export interface RawAnswer {
  status: number;
  text: string;
  retryAfter: string | undefined;
}

export class TransportError extends Error {}

export class Transport {
  private readonly http: http.Agent;
  private readonly https: https.Agent;

  constructor(
    private readonly headers: Record<string, string>,
    tls: TlsFiles,
    maxSockets: number,
    private readonly connectTimeout: number,
  ) {
    this.http = new http.Agent({ keepAlive: true, maxSockets });
    this.https = new https.Agent({
      keepAlive: true,
      maxSockets,
      ...(tls.ca ? { ca: readFileSync(tls.ca) } : {}),
      ...(tls.cert ? { cert: readFileSync(tls.cert) } : {}),
      ...(tls.key ? { key: readFileSync(tls.key) } : {}),
    });
  }

  /**
   * One request to `base` (`scheme://host:port`). `timeout`: the most to
   * wait for the answer (undefined: as long as it takes); `signal` aborts
   * it, closing the connection.
   */
  request(
    base: string,
    method: string,
    path: string,
    body: string | undefined,
    timeout: number | undefined,
    signal?: AbortSignal,
  ): Promise<RawAnswer> {
    const url = new URL(path, base);
    const secure = url.protocol === "https:";
    const module = secure ? https : http;
    return new Promise((resolve, reject) => {
      const request = module.request(
        url,
        {
          method,
          agent: secure ? this.https : this.http,
          headers: body === undefined ? this.headers : { ...this.headers, "content-length": Buffer.byteLength(body) },
          ...(signal ? { signal } : {}),
        },
        (response) => {
          const chunks: Buffer[] = [];
          response.on("data", (chunk: Buffer) => chunks.push(chunk));
          response.on("end", () => {
            clearTimeout(timer);
            const retryAfter = response.headers["retry-after"];
            resolve({
              status: response.statusCode ?? 0,
              text: Buffer.concat(chunks).toString("utf8"),
              retryAfter: typeof retryAfter === "string" ? retryAfter : undefined,
            });
          });
          response.on("error", fail);
        },
      );
      const limit = timeout === undefined ? undefined : timeout + this.connectTimeout;
      const timer =
        limit === undefined
          ? undefined
          : setTimeout(() => request.destroy(new TransportError(`no answer within ${Math.round(limit)}ms`)), limit);
      function fail(error: Error): void {
        clearTimeout(timer);
        reject(error.name === "AbortError" ? error : new TransportError(error.message || error.name, { cause: error }));
      }
      request.on("error", fail);
      request.end(body);
    });
  }

  close(): void {
    this.http.destroy();
    this.https.destroy();
  }
}
