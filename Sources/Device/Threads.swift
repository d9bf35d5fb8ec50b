import Glibc


/// A POSIX thread running one closure, joined by its owner. The data plane needs nothing more
/// than this and a semaphore, so it does not pull in a threading framework.
public final class OSThread: @unchecked Sendable {  // only its owner joins it; the thread it runs touches none of its fields
    private var thread = pthread_t()
    private var joined = false

    /// Starts `body` on a new thread.
    public init(_ body: @escaping @Sendable () -> Void) throws(DeviceError) {
        let box = Unmanaged.passRetained(Box(body)).toOpaque()
        let result = pthread_create(&thread, nil, { raw in
            guard let raw else { return nil }
            let box = Unmanaged<Box>.fromOpaque(raw).takeRetainedValue()
            box.body()
            return nil
        }, box)
        guard result == 0 else {
            Unmanaged<Box>.fromOpaque(box).release()
            throw DeviceError("start a thread", result)
        }
    }

    /// Starts `body` on a thread nobody waits for (it lives as long as the process).
    public static func detach(_ body: @escaping @Sendable () -> Void) throws(DeviceError) {
        let thread = try OSThread(body)
        pthread_detach(thread.thread)
        thread.joined = true
    }

    /// Waits until the closure has returned.
    public func join() {
        guard !joined else { return }
        joined = true
        pthread_join(thread, nil)
    }

    deinit {
        if !joined { pthread_detach(thread) }
    }

    private final class Box {
        let body: @Sendable () -> Void
        init(_ body: @escaping @Sendable () -> Void) { self.body = body }
    }
}

/// A counting semaphore (sem_init(3)), for a worker that sleeps until there is work.
public final class Semaphore: @unchecked Sendable {  // sem_post and sem_wait are safe from any thread; the pointer never changes
    private let semaphore = UnsafeMutablePointer<sem_t>.allocate(capacity: 1)

    public init(value: UInt32 = 0) { sem_init(semaphore, 0, value) }

    deinit {
        sem_destroy(semaphore)
        semaphore.deallocate()
    }

    public func signal() { sem_post(semaphore) }

    /// Waits for a signal; retries when a signal handler interrupts the wait.
    public func wait() {
        while sem_wait(semaphore) != 0 && errno == EINTR {}
    }
}
