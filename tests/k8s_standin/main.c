/* main.c: k8s-standin's command line (flags, --help), start-up (the namespaces every cluster
 * has, the node, the HTTP server, the kubelet thread, --ready-file) and shutdown on SIGTERM or
 * SIGINT (every pod process killed, exit 0). A stand-in for tests: see README.md. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "standin.h"

static const char USAGE[] =
    "usage: k8s-standin --port N [options]\n"
    "A stand-in Kubernetes API server (plain HTTP) with a stand-in kubelet, for tests.\n"
    "  --port N              port to listen on (0: pick a free one; see --ready-file)\n"
    "  --addr A              IPv4 address to listen on (default 127.0.0.1)\n"
    "  --kubelet-root DIR    where pod directories, volumes and logs go\n"
    "  --kubelet-mode M      process (default with --kubelet-root): run containers as local\n"
    "                        processes; phase-only: pods go straight to Running, no\n"
    "                        processes; off: no kubelet (default without --kubelet-root)\n"
    "  --token T             every request must carry 'Authorization: Bearer T' (else 401)\n"
    "  --history N           watch events kept for watches from a resourceVersion (1000)\n"
    "  --bookmark-ms MS      BOOKMARK interval on watches with allowWatchBookmarks (1000)\n"
    "  --gone-in-stream      an expired watch gets a 200 stream with an ERROR 410 event\n"
    "                        (default: an HTTP 410 Status reply)\n"
    "  --ready-file F        write the port number to F once listening\n"
    "  --kube-version MINOR  act as Kubernetes 1.MINOR (default 31): below 25 CRD validation\n"
    "                        rules are dropped unread; from 30 they ratchet; /version says it\n"
    "  --help                this text\n"
    "Test-only endpoints: POST/DELETE /standin/faults, GET/DELETE /standin/stats,\n"
    "GET /standin/access, POST /standin/expire (see tests/k8s_standin/README.md).\n";

static int parse_flags(int argc, char **argv, si_config *cfg)
{
    static const struct option opts[] = {
        {"port", required_argument, 0, 'p'},         {"addr", required_argument, 0, 'a'},
        {"kubelet-root", required_argument, 0, 'r'}, {"kubelet-mode", required_argument, 0, 'm'},
        {"token", required_argument, 0, 't'},        {"history", required_argument, 0, 'H'},
        {"bookmark-ms", required_argument, 0, 'b'},  {"gone-in-stream", no_argument, 0, 'g'},
        {"ready-file", required_argument, 0, 'f'},   {"help", no_argument, 0, 'h'},
        {"kube-version", required_argument, 0, 'k'}, {0, 0, 0, 0}};
    const char *mode = NULL;
    bool have_port = false;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'p': cfg->port = atoi(optarg); have_port = true; break;
        case 'a': cfg->addr = optarg; break;
        case 'r': cfg->kubelet_root = optarg; break;
        case 'm': mode = optarg; break;
        case 't': cfg->token = optarg; break;
        case 'H': cfg->history = atoi(optarg); break;
        case 'b': cfg->bookmark_ms = atoi(optarg); break;
        case 'g': cfg->gone_in_stream = true; break;
        case 'f': cfg->ready_file = optarg; break;
        case 'k': cfg->kube_minor = atoi(optarg); break;
        case 'h': fputs(USAGE, stdout); exit(0);
        default: fputs(USAGE, stderr); return -1;
        }
    }
    if (!have_port || cfg->port < 0 || cfg->port > 65535 || optind < argc) {
        fprintf(stderr, "k8s-standin: --port N (0-65535) is required and takes no other "
                        "arguments\n%s", USAGE);
        return -1;
    }
    cfg->kubelet_mode = cfg->kubelet_root ? SI_KUBELET_PROCESS : SI_KUBELET_OFF;
    if (mode && !strcmp(mode, "process"))
        cfg->kubelet_mode = SI_KUBELET_PROCESS;
    else if (mode && !strcmp(mode, "phase-only"))
        cfg->kubelet_mode = SI_KUBELET_PHASE_ONLY;
    else if (mode && !strcmp(mode, "off"))
        cfg->kubelet_mode = SI_KUBELET_OFF;
    else if (mode) {
        fprintf(stderr, "k8s-standin: --kubelet-mode is process, phase-only or off, not %s\n", mode);
        return -1;
    }
    if (cfg->kubelet_mode == SI_KUBELET_PROCESS && !cfg->kubelet_root) {
        fprintf(stderr, "k8s-standin: --kubelet-mode process needs --kubelet-root DIR\n");
        return -1;
    }
    if (cfg->kube_minor < 20 || cfg->kube_minor > 99) {
        fprintf(stderr, "k8s-standin: --kube-version is a minor version from 20 (1.20) on\n");
        return -1;
    }
    if (cfg->history < 1 || cfg->bookmark_ms < 1) {
        fprintf(stderr, "k8s-standin: --history and --bookmark-ms must be at least 1\n");
        return -1;
    }
    return 0;
}

/* The objects every cluster starts with. */
static void seed(si_server *srv)
{
    static const char *const namespaces[] = {"default", "kube-system", "kube-public",
                                             "kube-node-lease"};
    pthread_mutex_lock(&srv->store.mu);
    si_resource *nsr = si_builtin(&srv->store, "", "namespaces");
    for (size_t i = 0; i < 4; i++) {
        cJSON *ns = cJSON_CreateObject();
        si_set_str(si_obj_child(ns, "metadata"), "name", namespaces[i]);
        si_result res = si_create(srv, nsr, "", ns, NULL);
        si_result_free(&res);
    }
    if (srv->cfg.kubelet_mode != SI_KUBELET_OFF) {
        cJSON *node = cJSON_Parse(
            "{\"metadata\":{\"name\":\"" SI_NODE_NAME "\",\"labels\":{\"kubernetes.io/hostname\":\"" SI_NODE_NAME "\"}},"
            "\"status\":{\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\",\"reason\":"
            "\"KubeletReady\",\"message\":\"k8s-standin kubelet is ready\"}],\"addresses\":["
            "{\"type\":\"InternalIP\",\"address\":\"127.0.0.1\"}]}}");
        si_result res = si_create(srv, si_builtin(&srv->store, "", "nodes"), "", node, NULL);
        si_result_free(&res);
    }
    pthread_mutex_unlock(&srv->store.mu);
}

static int write_ready_file(const char *path, int port)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) || rename(tmp, path)) {
        fprintf(stderr, "k8s-standin: cannot write --ready-file %s: %m\n", path);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    si_server srv = {
        .cfg = {.addr = "127.0.0.1", .history = 1000, .bookmark_ms = 1000, .kube_minor = 31}};
    if (parse_flags(argc, argv, &srv.cfg))
        return 2;
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL); /* every thread inherits it; main waits below */
    signal(SIGPIPE, SIG_IGN);
    srv.started = time(NULL);
    si_store_init(&srv.store, (size_t)srv.cfg.history);
    srv.faults = si_faults_new();
    srv.stats = si_stats_new();
    srv.access = si_stats_new();
    si_resources_init(&srv);
    seed(&srv);
    int rc = 1;
    if (si_http_start(&srv) == 0) {
        if (srv.cfg.kubelet_mode != SI_KUBELET_OFF)
            srv.kubelet = si_kubelet_start(&srv);
        fprintf(stderr, "k8s-standin: serving http://%s:%d (kubelet %s)\n", srv.cfg.addr, srv.port,
                srv.cfg.kubelet_mode == SI_KUBELET_PROCESS ? "process"
                : srv.cfg.kubelet_mode == SI_KUBELET_PHASE_ONLY ? "phase-only" : "off");
        if (!srv.cfg.ready_file || write_ready_file(srv.cfg.ready_file, srv.port) == 0) {
            int sig;
            sigwait(&sigs, &sig);
            rc = 0;
        }
        si_kubelet_stop(srv.kubelet); /* kills every pod process (SIGKILL after 2 s) */
        si_http_stop(&srv);
    }
    si_faults_free(srv.faults);
    si_stats_free(srv.stats);
    si_stats_free(srv.access);
    si_store_free(&srv.store);
    return rc;
}
