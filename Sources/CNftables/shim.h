#include <nftables/libnftables.h>
