# Sourced by the scripts that install what the tests need (postgres.sh,
# promtool.sh); defines apt_install. The caller defines log and die.
#
#   apt_install PACKAGE "WHAT IS MISSING"
#
# Installs Debian's PACKAGE without recommended packages, as root only,
# running `apt-get update` first only when apt does not know the package
# yet. Every apt-get call has a time limit.
apt_install() {
    local package=$1 missing=$2
    [[ $(id -u) == 0 ]] || die "$missing; install it (apt-get install $package) or run this as root"
    command -v apt-get >/dev/null 2>&1 || die "$missing, and there is no apt-get to install it with"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-cache show "$package" >/dev/null 2>&1; then
        log "apt does not know $package yet: apt-get update"
        timeout 600 apt-get update >&2 || die "apt-get update failed or took over 10 minutes"
    fi
    log "installing $package with apt-get"
    timeout 900 apt-get install -y --no-install-recommends "$package" >&2 \
        || die "apt-get install $package failed or took over 15 minutes"
}
