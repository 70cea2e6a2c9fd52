// MetaQ 1.4's two load-balance strategies, transcribed from
// metamorphosis-client/.../consumer/DefaultLoadBalanceStrategy.java and ConsisHashStrategy.java
// (with xmemcached's HashAlgorithm.KETAMA_HASH / computeMd5), used to produce the expected
// assignments in test_assignors.py with Java's own String ordering, signed bytes and TreeMap.
//
//   javac -d /tmp MetaqAssign.java && java -cp /tmp MetaqAssign DEFAULT|CONSIST c1,c2 0-0,0-1,...
//   java -cp /tmp MetaqAssign KETAMA key...        (prints the ketama hash of each key)
// Not run by the suite (CI installs a JRE only); the outputs are pinned in test_assignors.py.
import java.security.MessageDigest;
import java.util.*;

public class MetaqAssign {
    static byte[] computeMd5(String k) throws Exception {
        MessageDigest md5 = MessageDigest.getInstance("MD5");
        md5.reset();
        md5.update(k.getBytes("UTF-8"));
        return md5.digest();
    }

    static long ketama(String k) throws Exception {
        byte[] bKey = computeMd5(k);
        long rv = (long) (bKey[3] & 0xFF) << 24 | (long) (bKey[2] & 0xFF) << 16
                | (long) (bKey[1] & 0xFF) << 8 | bKey[0] & 0xFF;
        return rv & 0xffffffffL;
    }

    static List<String> defaultStrategy(String consumerId, List<String> curConsumers,
            List<String> curPartitions) {
        int nPartsPerConsumer = curPartitions.size() / curConsumers.size();
        int nConsumersWithExtraPart = curPartitions.size() % curConsumers.size();
        int myConsumerPosition = curConsumers.indexOf(consumerId);
        if (myConsumerPosition < 0) return Collections.emptyList();
        int startPart = nPartsPerConsumer * myConsumerPosition
                + Math.min(myConsumerPosition, nConsumersWithExtraPart);
        int nParts = nPartsPerConsumer + (myConsumerPosition + 1 > nConsumersWithExtraPart ? 0 : 1);
        List<String> rt = new ArrayList<String>();
        for (int i = startPart; i < startPart + nParts; i++) rt.add(curPartitions.get(i));
        return rt;
    }

    static TreeMap<Long, String> buildConsumerMap(List<String> consumers) throws Exception {
        TreeMap<Long, String> consumerMap = new TreeMap<Long, String>();
        for (String consumer : consumers) {
            for (int i = 0; i < 160 / 4; i++) {
                byte[] digest = computeMd5(consumer + "-" + i);
                for (int h = 0; h < 4; h++) {
                    long k = (long) (digest[3 + h * 4] & 0xFF) << 24
                            | (long) (digest[2 + h * 4] & 0xFF) << 16
                            | (long) (digest[1 + h * 4] & 0xFF) << 8 | digest[h * 4] & 0xFF;
                    consumerMap.put(k, consumer);
                }
            }
        }
        return consumerMap;
    }

    static List<String> consistStrategy(String consumerId, List<String> curConsumers,
            List<String> curPartitions) throws Exception {
        TreeMap<Long, String> consumerMap = buildConsumerMap(curConsumers);
        List<String> rt = new ArrayList<String>();
        for (String partition : curPartitions) {
            Long hash = ketama(partition);
            Long target = hash;
            if (!consumerMap.containsKey(hash)) {
                target = consumerMap.ceilingKey(hash);
                if (target == null && !consumerMap.isEmpty()) target = consumerMap.firstKey();
            }
            if (consumerId.equals(consumerMap.get(target))) rt.add(partition);
        }
        return rt;
    }

    public static void main(String[] args) throws Exception {
        if (args[0].equals("KETAMA")) {
            for (int i = 1; i < args.length; i++) System.out.println(args[i] + " " + ketama(args[i]));
            return;
        }
        List<String> consumers = new ArrayList<String>(Arrays.asList(args[1].split(",")));
        List<String> partitions = new ArrayList<String>(Arrays.asList(args[2].split(",")));
        Collections.sort(consumers);   // ConsumerZooKeeper.getConsumersPerTopic
        Collections.sort(partitions);  // MetaZookeeper.getPartitionStringsForSubTopics
        for (String c : consumers) {
            List<String> mine = args[0].equals("DEFAULT") ? defaultStrategy(c, consumers, partitions)
                    : consistStrategy(c, consumers, partitions);
            System.out.println(c + " " + String.join(",", mine));
        }
    }
}
