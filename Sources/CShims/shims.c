// The shims are header-only; this file gives the target a translation unit.
#include "CShims.h"
