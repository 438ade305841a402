/* tls_floor.c: a floor under bench/reform's agent memory figure. A process that links OpenSSL
 * (libssl, libcrypto) and nothing else of edl's, initialises it as libcurl 7.88's OpenSSL back
 * end does in curl_global_init (built-in engines, the configuration file loaded), then waits
 * to be measured and killed. Every agent speaks TLS to etcd when its endpoints are https://,
 * and libcurl initialises its TLS back end at start whatever the endpoints, so this is memory
 * an agent holds before its own code runs. `tls_floor --loaded` skips the initialisation (the
 * cost of the libraries' mapping and relocation alone). Not a test; run by bench/reform. */
#include <openssl/ssl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--help") == 0) {
        printf("Usage: tls_floor [--loaded]\nInitialise OpenSSL as libcurl does (--loaded: "
               "do not), then pause until killed; bench/reform reads its memory.\n");
        return 0;
    }
    if (!(argc > 1 && strcmp(argv[1], "--loaded") == 0) &&
        !OPENSSL_init_ssl(OPENSSL_INIT_ENGINE_ALL_BUILTIN | OPENSSL_INIT_LOAD_CONFIG, NULL)) {
        fprintf(stderr, "tls_floor: OpenSSL's initialisation failed\n");
        return 1;
    }
    pause();
    return 0;
}
