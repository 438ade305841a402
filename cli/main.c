/* main.c: the `edl` command: dispatch to run, scale, status, stop, logs and service. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "edl/log.h"

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: edl COMMAND [ARGS...]\n"
            "\n"
            "Commands:\n"
            "  run --np MIN:MAX [options] -- TRAINER [ARGS...]   run an elastic job on this machine\n"
            "      (--ps MIN:MAX: with parameter servers; --teachers MIN:MAX --service NAME:\n"
            "      with teachers, for distillation)\n"
            "  run -f JOB.yaml [options]                         run a TrainingJob manifest here\n"
            "  scale JOB N [--role ps|teacher]                   set the job's replica count (workers,\n"
            "                                                    servers, teachers)\n"
            "  status JOB [--json]                               generation, members, servers, trainers,\n"
            "                                                    teachers\n"
            "  stop JOB                                          stop the job\n"
            "  logs JOB [--rank N] [--pod P] [--follow]          what a local job's trainers\n"
            "                                                    printed, by pod and rank\n"
            "  service register|list|deregister --service NAME   teachers of a distillation\n"
            "                                                    service (docs/distill.md)\n"
            "\n"
            "Each command takes --help. scale, status, stop and service find a local job's etcd by\n"
            "itself (the state file edl run writes);\n"
            "elsewhere pass --etcd URLS (and --cacert, --cert, --key, --user, --password-file as\n"
            "it needs) or set EDL_ETCD_ENDPOINTS (and EDL_ETCD_CACERT, ...).\n"
            "Exit codes: 0 success, 1 job failed or not found, 2 usage, 3 etcd unreachable or it\n"
            "refused our TLS certificate or credentials, 4 job stopped.\n");
}

int main(int argc, char **argv)
{
    edl_log_setup_from_env();
    if (argc < 2) {
        usage(stderr);
        return EDL_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("edl 0.1.0\n");
        return 0;
    }
    if (!strcmp(cmd, "run"))
        return cli_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "scale"))
        return cli_scale(argc - 1, argv + 1);
    if (!strcmp(cmd, "status"))
        return cli_status(argc - 1, argv + 1);
    if (!strcmp(cmd, "stop"))
        return cli_stop(argc - 1, argv + 1);
    if (!strcmp(cmd, "logs"))
        return cli_logs(argc - 1, argv + 1);
    if (!strcmp(cmd, "service"))
        return cli_service(argc - 1, argv + 1);
    fprintf(stderr, "edl: unknown command \"%s\"\n\n", cmd);
    usage(stderr);
    return EDL_EXIT_USAGE;
}
